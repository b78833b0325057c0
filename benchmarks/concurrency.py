"""Many clients at once: N prompts sent together to one engine, a streaming client thread each,
against the same requests served one at a time (benchmarks/README.md, "Many clients at once").

hetspec is served by `hetspec-launch CONFIG --http`; the peer by llama.cpp's `llama-server -np N` on
the config's target GGUF file, pinned to the cores hetspec's draft and target ran on. `--paced` paces
the config's target as a GPU instead, the engine in this process and each client on Engine.stream
(a paced target answers only the token ids it has traces of: the config's own target records them
first). Greedy. Exits 1 if a server left something behind or a paced output differs from its
request alone.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from hetspec.benchmarks.bench import llama_bin
from hetspec.benchmarks.bench.data import ALL_CATEGORIES, load_prompts
from hetspec.benchmarks.bench.machine import affinity, describe_machine, parse_isa
from hetspec.benchmarks.bench.paced import paced_config, record_missing
from hetspec.benchmarks.bench.served import HetspecServer, LlamaServer, free_port, stream_request
from hetspec.benchmarks.bench.settings import split_config
from hetspec.benchmarks.bench.stream_figures import request_figures, summarize
from hetspec.benchmarks.bench.tables import num, table
from hetspec.config import load_config
from hetspec.core.gpu_profiles import PROFILES
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer

SCHEMA = "hetspec-concurrency/1"
WARMUP_TOKENS = 8
DRAFTING = ("spec_rounds", "batched_rounds", "drafted", "accepted")     # summed per pass from hetspec's stats


def run(config: str, clients: list[int], max_tokens: int = 128, categories=("stubs", "code"), api: str = "chat",
        peer: str | None = None, peer_draft: str | None = None, hetspec: bool = True, slot_context: int = 1024,
        log=print, paced: str | None = None, traces: str = "") -> dict:
    """The results document: settings, the machine, and per engine its alone pass and a pass per N."""
    if paced and peer:
        raise ValueError("--paced measures hetspec alone: no peer")
    engine_config = split_config(config)[0]
    target = resolve_model(load_config(engine_config).target.model, "target")
    tokenizer = Tokenizer(target)
    count = lambda text: len(tokenizer.encode_text(text))
    prompts = load_prompts(categories)
    doc = {"schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": describe_machine(gpu=False),        # the engine's info names its target's device
           "settings": {"config": config, "target": target.file, "clients": clients, "max_tokens": max_tokens,
                        "categories": list(categories), "api": api, "temperature": 0, "paced": paced},
           "engines": {}, "leftovers": []}
    engines, cores = doc["engines"], affinity()
    with tempfile.TemporaryDirectory(prefix="hetspec-concurrency-") as logs:
        if paced:
            engines[f"hetspec, paced {paced}"] = _paced(engine_config, paced, traces, prompts, clients, max_tokens, api,
                                                        tokenizer, count, log)
        elif hetspec:
            log(f"starting hetspec-launch {config} --http ...")
            server = HetspecServer(config, Path(logs) / "hetspec.log")
            try:
                engines["hetspec"] = engine = {**_described(server.info), "command": " ".join(server.command)}
                client = _Client("hetspec", server.url, api, max_tokens, {}, count, log,
                                 os.environ.get("HETSPEC_API_KEY", ""))
                _serve(engine, client, prompts, clients)
                cores = engine["cores"]
            finally:
                doc["leftovers"] += server.stop()
        if peer:
            engines["llama-server"] = _llama(target.file, _peer_draft(engine_config, peer_draft), prompts, clients,
                                             max_tokens, api, count, cores, slot_context, Path(logs), doc, log)
    return doc


def _described(info: dict) -> dict:
    """What a results document keeps of the engine's get_info()."""
    roles = {role: {k: info[role].get(k) for k in ("backend", "cores", "threads", "kernels")}
             for role in ("draft", "target")}
    return {"cores": sorted(set(info["draft"]["cores"]) | set(info["target"]["cores"])), "gamma": info.get("gamma"),
            "device": info["target"].get("device"), "budget": info.get("budget"), **roles,
            "server": {k: info["config"]["server"].get(k) for k in ("max_running", "turn_s", "max_queue")}}


def _serve(engine: dict, client, prompts, clients: list[int]) -> dict:
    """A warm-up request, the first max(N) prompts alone, then a pass per N, into `engine`."""
    client.request(prompts[0], WARMUP_TOKENS)
    engine["alone"] = client.alone(prompts, max(clients))
    engine["passes"] = {str(n): client.concurrent(prompts, n, engine["alone"]) for n in clients}
    return engine


def _paced(config: dict, profile: str, traces: str, prompts, clients, max_tokens, api, tokenizer, count, log) -> dict:
    """The engine in this process, its target paced by `profile`, on the token ids the HTTP server would read
    (chat-templated for the chat API), after the config's own target recorded their traces."""
    import hetspec

    ids = {p.key: tokenizer.encode_chat([{"role": "user", "content": p.text}]) if api == "chat"
           else tokenizer.encode_prompt(p.text) for p in prompts[:max(clients)]}
    record_missing(config, ids, dict.fromkeys(ids, max_tokens), traces, log=log)
    log(f"starting the engine, its target paced by {profile} ...")
    with hetspec.launch(paced_config(config, profile, traces)) as engine:
        client = _EngineClient(engine, ids, max_tokens, count, log)
        return _serve({**_described(engine.get_info()), "profile": profile}, client, prompts, clients)


def _llama(target, draft, prompts, clients, max_tokens, api, count, cores, slot_context, logs, doc, log) -> dict:
    """One llama-server per N (-np N); the requests alone on the one of a single slot."""
    binary = llama_bin.find_server()
    if binary is None:
        raise SystemExit(llama_bin.server_missing_line())
    repack = llama_bin.repacks(target) and (draft is None or llama_bin.repacks(draft))
    engine = {"binary": str(binary), "cores": cores, "threads": len(cores), "draft": draft,
              "slot_context": slot_context, "settings": llama_bin.repack_note(repack), "commands": {}, "alone": None,
              "passes": {}}
    for slots in sorted({1, *clients}):
        log(f"starting llama-server -np {slots} ...")
        server = LlamaServer(llama_bin.server_command(binary, target, slots, slot_context, len(cores), cores,
                                                      free_port(), draft, repack), logs / f"llama-{slots}.log")
        try:
            engine["commands"][str(slots)] = " ".join(server.command)
            # each request prefills its whole prompt, as hetspec's target does
            client = _Client("llama-server", server.url, api, max_tokens, {"cache_prompt": False}, count, log)
            client.request(prompts[0], WARMUP_TOKENS)
            if engine["alone"] is None:
                engine["alone"] = client.alone(prompts, max(clients))
            if slots in clients:
                engine["passes"][str(slots)] = client.concurrent(prompts, slots, engine["alone"])
        finally:
            doc["leftovers"] += server.stop()
    return engine


class _Client:
    """Streaming requests to one server: alone, one after another, or n at once (a thread each)."""

    def __init__(self, name: str, url: str, api: str, max_tokens: int, extra: dict, count, log, api_key: str = ""):
        self.name, self.url, self.api, self.max_tokens = name, url, api, max_tokens
        self.extra, self.count, self.log, self.api_key = extra, count, log, api_key

    def request(self, prompt, tokens: int | None = None, start=None) -> dict:
        body = {"max_tokens": tokens or self.max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **self.extra,
                **({"messages": [{"role": "user", "content": prompt.text}]} if self.api == "chat"
                   else {"prompt": prompt.text})}
        return {**stream_request(self.url, self.api, body, start, self.api_key), "prompt": prompt.key}

    def alone(self, prompts, n: int) -> dict:
        """The first n prompts served one at a time, by prompt key."""
        out = {}
        for prompt in prompts[:n]:
            out[prompt.key] = record = request_figures(self.request(prompt), self.count)
            self.log(f"{self.name} alone {prompt.key}: {record['tokens']} tokens in {record['total_s']:.2f} s")
        return out

    def concurrent(self, prompts, n: int, alone: dict) -> dict:
        chosen, barrier, records = [prompts[i % len(prompts)] for i in range(n)], threading.Barrier(n), [None] * n

        def client(i: int) -> None:
            records[i] = self.request(chosen[i], start=barrier)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start = min(r["sent"] for r in records)
        done = [{**request_figures(r, self.count), "sent_s": r["sent"] - start} for r in records]
        summary = summarize(done, alone, max(r["done"] for r in records) - start)
        if all(r["hetspec"] for r in records):              # how the batch drafted
            summary.update({key: sum(r["hetspec"].get(key, 0) for r in records) for key in DRAFTING})
        self.log(f"{self.name} {n} at once: {summary['aggregate_tokens_per_s']:.1f} tok/s aggregate, "
                 f"{summary['vs_sequential']:.2f}x sequential, outputs equal alone {summary['equal_alone']}/{n}")
        return {**summary, "requests": done}


class _EngineClient(_Client):
    """The same requests to an engine in this process (Engine.stream, greedy), timed as stream_request times one."""

    def __init__(self, engine, ids: dict[str, list[int]], max_tokens: int, count, log):
        super().__init__("hetspec", "", "ids", max_tokens, {}, count, log)
        self.engine, self.ids = engine, ids

    def request(self, prompt, tokens: int | None = None, start=None) -> dict:
        ids = self.ids[prompt.key]
        if start is not None:
            start.wait()
        record = {"prompt": prompt.key, "chunks": [], "timings": None, "error": None, "sent": time.perf_counter()}
        stream = self.engine.stream(ids, max_new_tokens=tokens or self.max_tokens, temperature=0.0)
        record["chunks"] = [(time.perf_counter(), piece) for piece in stream if piece]
        result = stream.result
        return {**record, "done": time.perf_counter(), "text": "".join(t for _, t in record["chunks"]),
                "usage": {"completion_tokens": len(result.token_ids), "prompt_tokens": len(ids)},
                "hetspec": result.stats, "finish_reason": result.finish_reason}


def _peer_draft(engine_config: dict, peer_draft: str | None) -> str | None:
    if peer_draft != "config":
        return peer_draft
    model = load_config(engine_config).draft.model
    draft = resolve_model(model, "draft")
    if not draft.gguf_file:
        raise SystemExit(f"--peer-draft: the config's draft {model!r} is no GGUF file")
    return draft.file


def report(doc: dict) -> str:
    s, m = doc["settings"], doc["machine"]
    paced = f", its target paced by {s['paced']} (simulated GPU)" if s.get("paced") else ""
    lines = [f"# Many clients at once: {s['config']}{paced}", "", f"`{doc.get('command', '')}`", "",
             (f"{doc['created']}; {m['cpu']}, {m['logical_cores']} cores, {m['memory_gb']} GB "
              f"({m.get('isa', '?')}); git {m['git_commit']}."),
             (f"Target `{Path(s['target']).name}`; prompts: the first N of {', '.join(s['categories'])} "
              f"(benchmarks/data/continuation/), {s['api']} API, greedy, max_tokens {s['max_tokens']}, streamed."), ""]
    for name, engine in doc["engines"].items():
        lines += _engine_section(name, engine)
    lines.append("Aggregate: every token over the wall time, prompts included; summed decode: per request, tokens "
                 "after the first chunk over the time from it to the last; sequential: the same requests served one "
                 "at a time; ITL: gaps between chunks, a chunk of k tokens after g counting as k gaps of g/k. "
                 "Definitions: benchmarks/README.md, \"Many clients at once\".")
    if doc["leftovers"]:
        lines += ["", f"**Left behind (removed):** {', '.join(doc['leftovers'])}"]
    return "\n".join(lines) + "\n"


def _engine_section(name: str, engine: dict) -> list[str]:
    llama = name == "llama-server"
    if llama:
        where = f"cores {engine['cores']}, {engine['threads']} threads, {engine.get('settings')}" + (
            f", draft `{Path(engine['draft']).name}`" if engine.get("draft") else "")
    else:
        where = (f"draft {engine['draft']['backend']} on cores {engine['draft']['cores']}, target "
                 f"{engine['target']['backend']} on cores {engine['target']['cores']}; server {engine['server']}")
    rows = []
    for n, p in engine["passes"].items():
        predicted = (f"{p['summed_predicted_per_second']:.1f} ({p['alone_summed_predicted_per_second']:.1f})"
                     if "summed_predicted_per_second" in p else "-")
        rows.append([n, str(p["tokens"]), f"{p['wall_s']:.2f}", f"{p['aggregate_tokens_per_s']:.1f}",
                     f"{p['sequential_tokens_per_s']:.1f}", f"{p['vs_sequential']:.2f}x",
                     f"{p['summed_decode_tokens_per_s']:.1f}", *([predicted] if llama else []),
                     f"{num(p['ttft_mean_s'], 2)} / {num(p['ttft_max_s'], 2)}",
                     (f"{num(p['itl_p50_ms'])} / {num(p['itl_p99_ms'])} (alone {num(p['alone_itl_p50_ms'])} / "
                      f"{num(p['alone_itl_p99_ms'])})"), f"{p['equal_alone']}/{p['n']}"])
    header = ["N", "tokens", "wall s", "aggregate tok/s", "sequential tok/s", "ratio", "summed decode tok/s",
              *(["Σ predicted_per_second (alone)"] if llama else []), "TTFT mean / max s", "ITL p50 / p99 ms",
              "equal alone"]
    return [f"## {name}", "", where, "", *table(header, rows), ""]


def write(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "report.md").write_text(report(doc))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.concurrency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="smollm2", help="a shipped config's name or a TOML path")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8], help="requests at once, per pass")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--categories", nargs="+", default=["stubs", "code"], choices=ALL_CATEGORIES)
    parser.add_argument("--api", default="chat", choices=["chat", "completions"],
                        help="chat: the prompt as a user message (instruct models); completions: plain text")
    parser.add_argument("--peer", choices=["llama-server"], help="also run llama.cpp's llama-server")
    parser.add_argument("--peer-draft", nargs="?", const="config", default=None, metavar="GGUF",
                        help="llama-server -md: this GGUF file, or alone the config's draft file")
    parser.add_argument("--no-hetspec", action="store_true", help="the peer alone (on this process's cores)")
    parser.add_argument("--slot-context", type=int, default=1024, help="llama-server's context a slot (-c: N x it)")
    parser.add_argument("--paced", metavar="PROFILE", help=f"the config's target paced as a GPU ({', '.join(PROFILES)}"
                        " or a gpu_profile report, FILE.json), the engine in this process; records missing traces")
    parser.add_argument("--traces", default="", help="--paced: the recorded traces' folder (default: hetspec's cache)")
    parser.add_argument("--out", default="bench-out/concurrency")
    args = parse_isa(parser, argv)
    if args.paced and args.peer:
        parser.error("--paced measures hetspec alone: leave out --peer")
    started = time.perf_counter()
    doc = run(args.config, args.clients, args.max_tokens, args.categories, args.api, args.peer, args.peer_draft,
              not args.no_hetspec, args.slot_context, paced=args.paced, traces=args.traces)
    doc["command"] = "python -m hetspec.benchmarks.concurrency " + " ".join(sys.argv[1:] if argv is None else argv)
    doc["duration_s"] = round(time.perf_counter() - started, 1)
    write(doc, Path(args.out))
    print(report(doc))
    passes = [p for e in doc["engines"].values() for p in e["passes"].values()]
    differ = args.paced and any(p["equal_alone"] != p["n"] for p in passes)
    return 1 if doc["leftovers"] or differ else 0


if __name__ == "__main__":
    sys.exit(main())
