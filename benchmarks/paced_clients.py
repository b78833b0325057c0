"""Many clients at once against a paced target (a simulated GPU: workers/target/paced.py), the
engine in this process and a client thread each: what batching gives where a pass costs the
same for 1 to `flat_to` tokens (#60's GPU figure).

    python -m hetspec.benchmarks.paced_clients [--config qwen2.5-coder] [--profile h100-7b-eager]
        [--clients 1 8] [--max-tokens 128] [--traces DIR] [--out DIR]

The config's own target first records the greedy traces of the prompts (the first max(N) stubs
and code prompts, chat-templated as the HTTP server reads them; untimed, once: they are kept);
then the paced engine serves them one at a time, then N at once, for each N. The figures are
concurrency.py's (benchmarks/README.md, "Many clients at once"), the chunks those the engine
streams (Engine.stream).
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import hetspec
from hetspec.benchmarks import concurrency
from hetspec.benchmarks.bench.data import load_prompts
from hetspec.benchmarks.bench.machine import describe_machine
from hetspec.benchmarks.bench.paced import paced_config, record_missing
from hetspec.benchmarks.bench.settings import split_config
from hetspec.benchmarks.concurrency import _metrics, summarize
from hetspec.config import load_config
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer


def run(config: str, profile: str, clients: list[int], max_tokens: int, traces: str = "", log=print) -> dict:
    engine_config = split_config(config)[0]
    tokenizer = Tokenizer(resolve_model(load_config(engine_config).target.model, "target"))
    prompts = load_prompts(("stubs", "code"))[:max(clients)]
    ids = {p.key: tokenizer.encode_chat([{"role": "user", "content": p.text}]) for p in prompts}
    record_missing(engine_config, ids, dict.fromkeys(ids, max_tokens), traces, log=log)
    count = concurrency._counter(tokenizer)
    doc = {"config": config, "profile": profile, "max_tokens": max_tokens, "machine": describe_machine(gpu=False),
           "passes": []}
    with hetspec.launch(paced_config(engine_config, profile, traces)) as engine:
        info = engine.get_info()
        doc["kernels"], doc["budget"] = info["target"]["kernels"], info["budget"]
        alone = {k: _metrics(_request(engine, k, ids[k], max_tokens), count) for k in ids}
        for n in clients:
            records = _at_once(engine, {k: ids[k] for k in list(ids)[:n]}, max_tokens)
            start = min(r["sent"] for r in records)
            summary = summarize([_metrics(r, count) for r in records], alone, max(r["done"] for r in records) - start)
            summary.pop("requests", None)
            for key in ("spec_rounds", "batched_rounds", "drafted", "accepted"):   # how the batch drafted
                summary[key] = sum(r["hetspec"].get(key, 0) for r in records)
            doc["passes"].append(summary)
            log(f"{n} at once: summed decode {summary['summed_decode_tokens_per_s']:.1f} tok/s, aggregate "
                f"{summary['aggregate_tokens_per_s']:.1f} tok/s, equal alone {summary['equal_alone']}/{n}; "
                f"{summary['drafted']} tokens drafted, {summary['accepted']} accepted")
    one = doc["passes"][0]["summed_decode_tokens_per_s"]
    for p in doc["passes"]:
        p["summed_decode_vs_first"] = p["summed_decode_tokens_per_s"] / one
    return doc


def _at_once(engine, ids: dict[str, list[int]], max_tokens: int) -> list[dict]:
    """The requests sent together, a thread each (released by a barrier); their records."""
    barrier, records = threading.Barrier(len(ids)), [None] * len(ids)

    def client(i: int, key: str) -> None:
        records[i] = _request(engine, key, ids[key], max_tokens, barrier)

    threads = [threading.Thread(target=client, args=(i, key)) for i, key in enumerate(ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def _request(engine, key: str, ids: list[int], max_tokens: int, start: threading.Barrier | None = None) -> dict:
    """One greedy request streamed from the engine, timed as concurrency.stream_request times one over HTTP."""
    if start is not None:
        start.wait()
    record = {"prompt": key, "chunks": [], "timings": None, "error": None, "sent": time.perf_counter()}
    stream = engine.stream(ids, max_new_tokens=max_tokens, temperature=0.0)
    for piece in stream:
        if piece:
            record["chunks"].append((time.perf_counter(), piece))
    record.update(done=time.perf_counter(), text="".join(t for _, t in record["chunks"]),
                  usage={"completion_tokens": len(stream.result.token_ids), "prompt_tokens": len(ids)},
                  hetspec=stream.result.stats, finish_reason=stream.result.finish_reason)
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.paced_clients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="qwen2.5-coder")
    parser.add_argument("--profile", default="h100-7b-eager")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--traces", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    doc = run(args.config, args.profile, args.clients, args.max_tokens, args.traces)
    lines = [f"| {p['n']} | {p['summed_decode_tokens_per_s']:.1f} | {p['summed_decode_vs_first']:.2f}x | "
             f"{p['aggregate_tokens_per_s']:.1f} | {p['itl_p50_ms']:.1f} / {p['itl_p99_ms']:.1f} | "
             f"{p['equal_alone']}/{p['n']} |" for p in doc["passes"]]
    print("| N | summed decode tok/s | vs the first N | aggregate tok/s | ITL p50 / p99 ms | equal alone |\n"
          "|---|---|---|---|---|---|\n" + "\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(doc, indent=1))
    return 0 if all(p["equal_alone"] == p["n"] for p in doc["passes"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
