"""Many clients at once: N prompts sent together to one engine, a streaming client thread each,
against the same requests served one at a time (benchmarks/README.md, "Many clients at once").

hetspec is served by `hetspec-launch CONFIG --http`; the peer by llama.cpp's `llama-server -np N` on
the config's target GGUF file and hetspec's cores. `--paced` paces the config's target as a GPU
instead, the engine in this process and each client on Engine.stream (the config's own target first
records the traces a paced target answers from). Greedy. Exits 1 if a server left something behind
or a paced output differs from its request alone."""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import hetspec
from hetspec.benchmarks.bench import llama_bin
from hetspec.benchmarks.bench.data import ALL_CATEGORIES, load_prompts, tokenized
from hetspec.benchmarks.bench.machine import describe_machine, parse_isa
from hetspec.benchmarks.bench.paced import paced_config, record_missing
from hetspec.benchmarks.bench.served import HetspecServer, Served, free_port, stream_request
from hetspec.benchmarks.bench.settings import split_config
from hetspec.benchmarks.bench.tables import num, table, write_outputs
from hetspec.config import load_config
from hetspec.core.gpu_profiles import PROFILES
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer

SCHEMA = "hetspec-concurrency/1"
WARMUP_TOKENS = 8
SLOT_CONTEXT = 1024     # llama-server's context a slot (-c: N x it)
DRAFTING = ("spec_rounds", "batched_rounds", "drafted", "accepted")     # summed per pass from hetspec's stats


def run(config: str, clients: list[int], max_tokens: int = 128, categories=("stubs", "code"), api: str = "chat",
        peer: str | None = None, log=print, paced: str | None = None, traces: str = "") -> dict:
    """The results document: settings, the machine, and per engine its alone pass and a pass per N."""
    if paced and peer:
        raise SystemExit("--paced measures hetspec alone: leave out --peer")
    binary = llama_bin.find_server() if peer else None
    if peer and binary is None:
        raise SystemExit(llama_bin.server_missing_line())
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
    if paced:
        doc["engines"][f"hetspec, paced {paced}"] = _paced(engine_config, paced, traces, prompts, clients, max_tokens,
                                                           api, tokenizer, count, log)
        return doc
    with tempfile.TemporaryDirectory(prefix="hetspec-concurrency-") as logs:
        log(f"starting hetspec-launch {config} --http ...")
        server = HetspecServer(config, Path(logs) / "hetspec.log")
        try:
            doc["engines"]["hetspec"] = engine = {**_described(server.info), "command": " ".join(server.command)}
            client = _Client("hetspec", server.url, api, max_tokens, {}, count, log, os.environ.get("HETSPEC_API_KEY", ""))
            _serve(engine, client, prompts, clients)
        finally:
            doc["leftovers"] += server.stop()
        if peer:
            doc["engines"]["llama-server"] = _llama(binary, target.file, prompts, clients, max_tokens, api, count,
                                                    engine["cores"], Path(logs), doc, log)
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
    ids = tokenized(prompts[:max(clients)], tokenizer, api == "chat")[1]
    record_missing(config, ids, dict.fromkeys(ids, max_tokens), traces, log=log)
    log(f"starting the engine, its target paced by {profile} ...")
    with hetspec.launch(paced_config(config, profile, traces)) as engine:
        client = _EngineClient(engine, ids, max_tokens, count, log)
        return _serve({**_described(engine.get_info()), "profile": profile}, client, prompts, clients)


def _llama(binary, target, prompts, clients, max_tokens, api, count, cores, logs, doc, log) -> dict:
    """One llama-server per N (-np N) on hetspec's cores; the requests alone on the one of a single slot."""
    repack = llama_bin.repacks(target)
    engine = {"binary": str(binary), "cores": cores, "threads": len(cores), "slot_context": SLOT_CONTEXT,
              "settings": llama_bin.repack_note(repack), "commands": {}, "alone": None, "passes": {}}
    for slots in sorted({1, *clients}):
        log(f"starting llama-server -np {slots} ...")
        server = Served(llama_bin.server_command(binary, target, slots, SLOT_CONTEXT, len(cores), cores, free_port(),
                                                 repack), logs / f"llama-{slots}.log")
        server.wait_ready()
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
        chosen, barrier = [prompts[i % len(prompts)] for i in range(n)], threading.Barrier(n)
        with ThreadPoolExecutor(n) as pool:         # a thread each, released together by the barrier
            records = list(pool.map(lambda prompt: self.request(prompt, start=barrier), chosen))
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
        sent, stream = time.perf_counter(), self.engine.stream(ids, max_new_tokens=tokens or self.max_tokens,
                                                               temperature=0.0)
        chunks = [(time.perf_counter(), piece) for piece in stream if piece]
        result = stream.result
        return {"prompt": prompt.key, "sent": sent, "chunks": chunks, "done": time.perf_counter(), "timings": None,
                "error": None, "text": "".join(t for _, t in chunks), "hetspec": result.stats,
                "usage": {"completion_tokens": len(result.token_ids), "prompt_tokens": len(ids)},
                "finish_reason": result.finish_reason}


# ---- the figures of streamed requests (benchmarks/README.md, "Many clients at once") ----------

def chunk_counts(texts: list[str], total: int, count) -> list[int]:
    """Tokens in each chunk: the growth of the text's token count (re-tokenized), never negative, the
    last chunk bringing the sum to `total` (the server's usage)."""
    counts, before, text = [], 0, ""
    for i, piece in enumerate(texts):
        text += piece
        now = total if i == len(texts) - 1 else min(total, count(text))
        counts.append(max(0, now - before))
        before = max(before, now)
    return counts


def request_figures(record: dict, count) -> dict:
    """One request: its tokens, time to first token, decode rate after the first chunk, inter-token gaps."""
    if record["error"]:
        raise RuntimeError(f"request {record['prompt']} failed: {record['error']}")
    usage = record["usage"] or {}
    total = int(usage.get("completion_tokens") or count(record["text"]))
    times = [at - record["sent"] for at, _ in record["chunks"]]
    counts = chunk_counts([text for _, text in record["chunks"]], total, count)
    out = {"prompt": record["prompt"], "tokens": total, "prompt_tokens": usage.get("prompt_tokens"),
           "total_s": record["done"] - record["sent"], **_timing(times, counts, total),
           "chunks": [[round(t, 5), k] for t, k in zip(times, counts)], "finish_reason": record["finish_reason"],
           "text": record["text"]}
    if record["timings"]:                      # llama-server's own
        out.update(predicted_per_second=record["timings"].get("predicted_per_second"), timings=record["timings"])
    return {**out, "hetspec": record["hetspec"]} if record["hetspec"] else out


def _timing(times: list[float], counts: list[int], total: int) -> dict:
    """TTFT, the decode rate after the first chunk, and the gaps: a chunk of k tokens after g, k gaps of g/k."""
    arrived = [(t, k) for t, k in zip(times, counts) if k > 0]
    if not arrived:
        return {"ttft_s": None, "decode_tokens_per_s": None, "gaps_s": []}
    gaps = [(t - before) / k for (before, _), (t, k) in itertools.pairwise(arrived) for _ in range(k)]
    after, span = total - arrived[0][1], arrived[-1][0] - arrived[0][0]
    return {"ttft_s": arrived[0][0], "decode_tokens_per_s": after / span if after and span > 0 else None, "gaps_s": gaps}


def summarize(requests: list[dict], alone: dict, wall_s: float) -> dict:
    """A pass of N requests at once against the same requests served alone."""
    tokens, solo = sum(r["tokens"] for r in requests), [alone[r["prompt"]] for r in requests]
    sequential = sum(s["tokens"] for s in solo) / sum(s["total_s"] for s in solo)
    ttfts = [r["ttft_s"] for r in requests if r["ttft_s"] is not None]
    differ = [r["prompt"] for r, s in zip(requests, solo) if r["text"] != s["text"]]
    predicted = all(r.get("predicted_per_second") for r in requests + solo)
    return {"n": len(requests), "tokens": tokens, "wall_s": wall_s, "aggregate_tokens_per_s": tokens / wall_s,
            "summed_decode_tokens_per_s": sum(r["decode_tokens_per_s"] or 0 for r in requests),
            "sequential_tokens_per_s": sequential, "vs_sequential": tokens / wall_s / sequential,
            "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None, "ttft_max_s": max(ttfts, default=None),
            "equal_alone": len(requests) - len(differ), "differ": differ,
            **_latencies(requests, "", predicted), **_latencies(solo, "alone_", predicted)}


def _latencies(requests: list[dict], prefix: str, predicted: bool) -> dict:
    """ITL p50 and p99 over every gap (numpy's linear percentiles); where every request has llama-server's own
    decode rate, their sum."""
    gaps = [g for r in requests for g in r["gaps_s"]]
    out = {f"{prefix}itl_p{q}_ms": float(np.percentile(gaps, q)) * 1000 if gaps else None for q in (50, 99)}
    if predicted:
        out[f"{prefix}summed_predicted_per_second"] = sum(r["predicted_per_second"] for r in requests)
    return out


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
    where = (f"cores {engine['cores']}, {engine['threads']} threads, {engine['settings']}" if llama else
             f"draft {engine['draft']['backend']} on cores {engine['draft']['cores']}, target "
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
    write_outputs(out, doc, report(doc))


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
    parser.add_argument("--paced", metavar="PROFILE", help=f"the config's target paced as a GPU ({', '.join(PROFILES)}"
                        " or a gpu_profile report, FILE.json), the engine in this process; records missing traces")
    parser.add_argument("--traces", default="", help="--paced: the recorded traces' folder (default: hetspec's cache)")
    parser.add_argument("--out", default="bench-out/concurrency")
    args = parse_isa(parser, argv)
    started = time.perf_counter()
    doc = run(args.config, args.clients, args.max_tokens, args.categories, args.api, args.peer, paced=args.paced,
              traces=args.traces)
    doc.update(command="python -m hetspec.benchmarks.concurrency " + " ".join(sys.argv[1:] if argv is None else argv),
               duration_s=round(time.perf_counter() - started, 1))
    write(doc, Path(args.out))
    print(report(doc))
    differ = any(p["equal_alone"] != p["n"] for e in doc["engines"].values() for p in e["passes"].values())
    return 1 if doc["leftovers"] or (args.paced and differ) else 0


if __name__ == "__main__":
    sys.exit(main())
