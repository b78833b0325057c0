"""Many clients at once: N held-out code prompts sent together over HTTP to a real server, one
streaming client thread each, against the same requests served one at a time.

    python -m hetspec.benchmarks.concurrency [--config smollm2] [--clients 1 2 4 8] [--max-tokens 128]
        [--categories stubs code] [--api chat|completions] [--peer llama-server [--peer-draft [GGUF]]]
        [--no-hetspec] [--slot-context 1024] [--out DIR]

hetspec is served by `hetspec-launch CONFIG --http`; the peer by llama.cpp's `llama-server -np N` on
the config's target GGUF file (`scripts/build_llama_cpp.sh --server` builds it), pinned to the cores
hetspec's draft and target ran on, one thread a core. Greedy (temperature 0). Per N: aggregate tok/s
(every generated token over the wall time, prompts included), the summed decode rate, the same
requests served alone, inter-token latency and whether every output equals its request served
alone. Definitions: benchmarks/README.md, "Many clients at once". Writes DIR/report.md and
DIR/results.json; exits 1 if a request failed or a server left something behind.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from hetspec.benchmarks.bench import llama_bin
from hetspec.benchmarks.bench.data import ALL_CATEGORIES, load_prompts
from hetspec.benchmarks.bench.machine import add_isa_option, describe_machine, use_isa
from hetspec.benchmarks.bench.served import CpuWatch, HetspecServer, LlamaServer, free_port, stream_request
from hetspec.config import load_config
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer

SCHEMA = "hetspec-concurrency/1"
WARMUP_TOKENS = 8


def run(config: str, clients: list[int], max_tokens: int = 128, categories=("stubs", "code"), api: str = "chat",
        peer: str | None = None, peer_draft: str | None = None, hetspec: bool = True, slot_context: int = 1024,
        log=print) -> dict:
    """The results document: settings, the machine, and per engine its alone pass and a pass per N."""
    engine_config = load_config(config)
    target = resolve_model(engine_config.target.model, "target")
    count = _counter(Tokenizer(target))
    prompts = load_prompts(categories)
    if not prompts:
        raise ValueError("no prompts in the categories asked for")
    doc = {"schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": describe_machine(gpu=False),        # the engine's info names its target's device
           "settings": {"config": config, "target": target.file, "clients": clients, "max_tokens": max_tokens,
                        "categories": list(categories), "api": api, "temperature": 0},
           "engines": {}, "leftovers": []}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="hetspec-concurrency-") as logs:
        if hetspec:
            doc["engines"]["hetspec"], cores = _hetspec(config, prompts, clients, max_tokens, api, count,
                                                        Path(logs), doc["leftovers"], log)
        if peer:
            draft = _peer_draft(engine_config, peer_draft)
            doc["engines"]["llama-server"] = _llama(target.file, draft, prompts, clients, max_tokens, api, count,
                                                    cores, slot_context, Path(logs), doc["leftovers"], log)
    return doc


def _hetspec(config, prompts, clients, max_tokens, api, count, logs: Path, leftovers: list, log):
    log(f"starting hetspec-launch {config} --http ...")
    server = HetspecServer(config, logs / "hetspec.log")
    try:
        info = server.info
        cores = sorted(set(info["draft"]["cores"]) | set(info["target"]["cores"]))
        engine = {"cores": cores, "gamma": info.get("gamma"), "device": info["target"].get("device"),
                  "draft": {k: info["draft"].get(k) for k in ("backend", "cores", "threads", "kernels")},
                  "target": {k: info["target"].get(k) for k in ("backend", "cores", "threads", "kernels")},
                  "server": {k: info["config"]["server"].get(k) for k in ("max_running", "turn_s", "max_queue")},
                  "command": " ".join(server.command)}
        client = _Client("hetspec", server, api, max_tokens, {}, count, log, os.environ.get("HETSPEC_API_KEY", ""))
        client.request(prompts[0], WARMUP_TOKENS)
        engine["alone"], engine["alone_cpu"] = client.alone(prompts, max(clients))
        engine["passes"] = {str(n): client.concurrent(prompts, n, engine["alone"]) for n in clients}
    finally:
        leftovers += server.stop()
    return engine, cores


def _llama(target, draft, prompts, clients, max_tokens, api, count, cores, slot_context, logs, leftovers, log):
    """One llama-server per N (-np N); the requests alone on the one of a single slot."""
    binary = llama_bin.find_server()
    if binary is None:
        raise SystemExit(llama_bin.server_missing_line())
    repack = llama_bin.repacks(target) and (draft is None or llama_bin.repacks(draft))
    engine = {"binary": str(binary), "cores": cores, "threads": len(cores), "draft": draft,
              "slot_context": slot_context, "settings": llama_bin.repack_note(repack), "commands": {}, "alone": None,
              "passes": {}}
    extra = {"cache_prompt": False}            # each request prefills its whole prompt, as hetspec's target does
    for slots in sorted({1, *clients}):
        log(f"starting llama-server -np {slots} ...")
        command = llama_bin.server_command(binary, target, slots, slot_context, len(cores), cores, free_port(),
                                           draft, repack)
        server = LlamaServer(command, logs / f"llama-{slots}.log")
        try:
            engine["commands"][str(slots)] = " ".join(server.command)
            client = _Client("llama-server", server, api, max_tokens, extra, count, log)
            client.request(prompts[0], WARMUP_TOKENS)
            if engine["alone"] is None:
                engine["alone"], engine["alone_cpu"] = client.alone(prompts, max(clients))
            if slots in clients:
                engine["passes"][str(slots)] = client.concurrent(prompts, slots, engine["alone"])
        finally:
            leftovers += server.stop()
    return engine


class _Client:
    """Streaming requests to one server: alone, one after another, or n at once (a thread each)."""

    def __init__(self, name: str, server, api: str, max_tokens: int, extra: dict, count, log, api_key: str = ""):
        self.name, self.server, self.api, self.max_tokens = name, server, api, max_tokens
        self.extra, self.count, self.log, self.api_key = extra, count, log, api_key

    def request(self, prompt, tokens: int | None = None, start=None) -> dict:
        body = {"max_tokens": tokens or self.max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **self.extra}
        body.update({"messages": [{"role": "user", "content": prompt.text}]} if self.api == "chat"
                    else {"prompt": prompt.text})
        record = stream_request(self.server.url, self.api, body, start, self.api_key)
        record["prompt"] = prompt.key
        return record

    def alone(self, prompts, n: int) -> tuple[dict, dict]:
        """The first n prompts served one at a time, by prompt key; the CPU time meanwhile."""
        out, watch = {}, CpuWatch(self.server.processes)
        for prompt in prompts[:n]:
            out[prompt.key] = record = _metrics(self.request(prompt), self.count)
            self.log(f"{self.name} alone {prompt.key}: {record['tokens']} tokens in {record['total_s']:.2f} s")
        return out, watch.done()

    def concurrent(self, prompts, n: int, alone: dict) -> dict:
        chosen = [prompts[i % len(prompts)] for i in range(n)]
        barrier, records = threading.Barrier(n), [None] * n

        def client(i: int) -> None:
            records[i] = self.request(chosen[i], start=barrier)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        watch = CpuWatch(self.server.processes)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = watch.done()
        start = min(r["sent"] for r in records)
        done = [{**_metrics(r, self.count), "sent_s": r["sent"] - start} for r in records]
        summary = summarize(done, alone, max(r["done"] for r in records) - start)
        self.log(f"{self.name} {n} at once: {summary['aggregate_tokens_per_s']:.1f} tok/s aggregate, "
                 f"{summary['vs_sequential']:.2f}x sequential, outputs equal alone {summary['equal_alone']}/{n}, "
                 f"other processes' load {cpu['others_cores']} cores, steal {cpu['steal_cores']}")
        return {**summary, "cpu": cpu, "requests": done}


def _counter(tokenizer: Tokenizer):
    return lambda text: len(tokenizer.encode_text(text))


def _peer_draft(engine_config, peer_draft: str | None) -> str | None:
    if peer_draft != "config":
        return peer_draft
    draft = resolve_model(engine_config.draft.model, "draft")
    if not draft.gguf_file:
        raise SystemExit(f"--peer-draft: the config's draft {engine_config.draft.model!r} is no GGUF file")
    return draft.file


# ---- statistics --------------------------------------------------------------------------------

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


def _metrics(record: dict, count) -> dict:
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
        out["predicted_per_second"] = record["timings"].get("predicted_per_second")
        out["timings"] = record["timings"]
    if record["hetspec"]:
        out["hetspec"] = record["hetspec"]
    return out


def _timing(times: list[float], counts: list[int], total: int) -> dict:
    """TTFT, the decode rate after the first chunk, and the gaps: a chunk of k tokens after g, k gaps of g/k."""
    arrived = [(t, k) for t, k in zip(times, counts) if k > 0]
    if not arrived:
        return {"ttft_s": None, "decode_tokens_per_s": None, "gaps_s": []}
    gaps = [(t - before) / k for (before, _), (t, k) in itertools.pairwise(arrived) for _ in range(k)]
    after, span = total - arrived[0][1], arrived[-1][0] - arrived[0][0]
    return {"ttft_s": arrived[0][0], "decode_tokens_per_s": after / span if after and span > 0 else None,
            "gaps_s": gaps}


def summarize(requests: list[dict], alone: dict, wall_s: float) -> dict:
    """A pass of N requests at once against the same requests served alone."""
    tokens = sum(r["tokens"] for r in requests)
    solo = [alone[r["prompt"]] for r in requests]
    sequential = sum(s["tokens"] for s in solo) / sum(s["total_s"] for s in solo)
    ttfts = [r["ttft_s"] for r in requests if r["ttft_s"] is not None]
    differ = [r["prompt"] for r, s in zip(requests, solo) if r["text"] != s["text"]]
    out = {"n": len(requests), "tokens": tokens, "wall_s": wall_s, "aggregate_tokens_per_s": tokens / wall_s,
           "summed_decode_tokens_per_s": sum(r["decode_tokens_per_s"] or 0 for r in requests),
           "sequential_tokens_per_s": sequential, "vs_sequential": tokens / wall_s / sequential,
           "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None, "ttft_max_s": max(ttfts, default=None),
           **_itl(requests, ""), **_itl(solo, "alone_"), "equal_alone": len(requests) - len(differ), "differ": differ}
    return {**out, **_predicted(requests, solo)}


def _predicted(requests: list[dict], solo: list[dict]) -> dict:
    """llama-server's own decode rates, summed over the requests (at once, and alone)."""
    if not all(r.get("predicted_per_second") for r in requests + solo):
        return {}
    return {"summed_predicted_per_second": sum(r["predicted_per_second"] for r in requests),
            "alone_summed_predicted_per_second": sum(s["predicted_per_second"] for s in solo)}


def _itl(requests: list[dict], prefix: str) -> dict:
    gaps = [g for r in requests for g in r["gaps_s"]]
    return {f"{prefix}itl_p50_ms": _percentile(gaps, 50), f"{prefix}itl_p99_ms": _percentile(gaps, 99)}


def _percentile(gaps: list[float], q: float) -> float | None:
    return float(np.percentile(gaps, q)) * 1000 if gaps else None


# ---- the report --------------------------------------------------------------------------------

def report(doc: dict) -> str:
    s, m = doc["settings"], doc["machine"]
    lines = [f"# Many clients at once: {s['config']}", "",
             f"`{doc.get('command', '')}`", "",
             (f"{doc['created']}; {m['cpu']}, {m['logical_cores']} cores, {m['memory_gb']} GB "
              f"({m.get('isa', '?')}); git {m['git_commit']}."),
             (f"Target `{Path(s['target']).name}`; prompts: the first N of {', '.join(s['categories'])} "
             f"(benchmarks/data/continuation/), {s['api']} API, greedy, max_tokens {s['max_tokens']}, streamed."), ""]
    for name, engine in doc["engines"].items():
        lines += _engine_section(name, engine)
    lines += [("Aggregate: every generated token over the wall time from the first request sent to the last "
              "finished (prompts included). Summed decode: the sum over requests of (tokens after the first chunk) / "
              "(time from the first chunk to the last). Sequential: the same requests served one at a time "
              "(their tokens over the sum of their times). ITL: gaps between a request's chunks, a chunk of k "
              "tokens after a gap g counting as k gaps of g/k; p50 and p99 over every request of the pass. "
              "Equal alone: outputs whose text equals the same request served alone. Others' load: the cores' busy "
              "time during the pass not spent by the server's processes or the benchmark's, over the wall time "
              "(a shared machine's other work); steal: the hypervisor's time for other guests, in cores. Definitions: "
              "benchmarks/README.md, \"Many clients at once\".")]
    if doc["leftovers"]:
        lines += ["", f"**Left behind (removed):** {', '.join(doc['leftovers'])}"]
    return "\n".join(lines) + "\n"


def _engine_section(name: str, engine: dict) -> list[str]:
    llama = name == "llama-server"
    where = (f"cores {engine['cores']}, {engine['threads']} threads, {engine.get('settings')}"
             + (f", draft `{Path(engine['draft']).name}`" if engine.get("draft") else "")) if llama else \
        (f"draft {engine['draft']['backend']} on cores {engine['draft']['cores']}, target {engine['target']['backend']} "
         f"on cores {engine['target']['cores']}; server {engine['server']}")
    head = "| N | tokens | wall s | aggregate tok/s | sequential tok/s | ratio | summed decode tok/s | "
    head += "Σ predicted_per_second (alone) | " if llama else ""
    alone = engine.get("alone_cpu") or {}
    lines = [f"## {name}", "", where + f"; while served alone, other processes' load {alone.get('others_cores')} "
                                       f"cores, steal {alone.get('steal_cores')}", "",
             head + "TTFT mean / max s | ITL p50 / p99 ms | equal alone | others' load / steal |",
             "|" + "---|" * (12 if llama else 11)]
    for n, p in engine["passes"].items():
        row = (f"| {n} | {p['tokens']} | {p['wall_s']:.2f} | {p['aggregate_tokens_per_s']:.1f} | "
               f"{p['sequential_tokens_per_s']:.1f} | {p['vs_sequential']:.2f}x | {p['summed_decode_tokens_per_s']:.1f} | ")
        if llama:
            row += (f"{p['summed_predicted_per_second']:.1f} ({p['alone_summed_predicted_per_second']:.1f}) | "
                    if "summed_predicted_per_second" in p else "- | ")
        row += (f"{_s(p['ttft_mean_s'])} / {_s(p['ttft_max_s'])} | {_ms(p['itl_p50_ms'])} / {_ms(p['itl_p99_ms'])} "
                f"(alone {_ms(p['alone_itl_p50_ms'])} / {_ms(p['alone_itl_p99_ms'])}) | {p['equal_alone']}/{p['n']} | "
                f"{p['cpu']['others_cores']} / {p['cpu'].get('steal_cores')} |")
        lines.append(row)
    return lines + [""]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "report.md").write_text(report(doc))


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    use_isa(args.isa)
    started = time.perf_counter()
    doc = run(args.config, args.clients, args.max_tokens, args.categories, args.api, args.peer, args.peer_draft,
              not args.no_hetspec, args.slot_context)
    doc["command"] = "python -m hetspec.benchmarks.concurrency " + " ".join(sys.argv[1:] if argv is None else argv)
    doc["duration_s"] = round(time.perf_counter() - started, 1)
    write(doc, Path(args.out))
    print(report(doc))
    return 1 if doc["leftovers"] else 0


def _parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--slot-context", type=int, default=1024, help="llama-server's context per slot (-c is N x it)")
    parser.add_argument("--out", default="bench-out/concurrency")
    add_isa_option(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main())
