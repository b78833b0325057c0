"""The native target alone against llama.cpp's own loop (llama-bench), on the same GGUF
file and the same cores: decoding after a 150-token context, prefill, and what a verify
window of 4 and 8 tokens costs, on 1 thread, 2 and every core.

    python -m hetspec.benchmarks.target_alone [--model builtin:smollm2 ...] [--threads 1 2] [--out DIR]

Each model is loaded once, its kernels already built (its load time is reported beside
llama.cpp's); then, per
thread count, hetspec and llama-bench take turns, REPS times, and each number is the
median of its turns, so both see the same drift of the machine. llama-bench comes from
scripts/build_llama_cpp.sh (benchmarks/llama_bin.py finds it). The window costs are the
native target's verify passes (hs_forward_window) against llama-bench's pp4 and pp8.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from hetspec.benchmarks.llama_bin import completion_command, find_binaries, missing_line, parse_bench_json, pinned
from hetspec.core.pinning import pin
from hetspec.models import resolve_model
from hetspec.workers.common.pinning import pin_threads

DEPTH, DECODE, PREFILL, WINDOWS = 150, 32, 150, (4, 8)
REPS = 3
MODELS = ("builtin:smollm2", "builtin:gemma3-270m")


def hetspec_turn(model, threads: int, cores: list[int]) -> dict:
    """One turn of the native target: prefill, decode after DEPTH, window costs (ms). Its
    threads are pinned a core each, as the target worker pins them (CoreLoan): left to
    float over both cores, two threads shared one at times (2-thread decode ~20% slower)."""
    model.set_threads(threads)
    pin_threads(cores, threads, model.thread_ids)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 5000, PREFILL)]
    start = time.perf_counter()
    token = int(model.forward(0, prompt, 0, 1)[0].argmax())
    prefill = PREFILL / (time.perf_counter() - start)
    start, pos = time.perf_counter(), PREFILL
    for _ in range(DECODE):
        token = int(model.forward(0, [token], pos, 1)[0].argmax())
        pos += 1
    decode = DECODE / (time.perf_counter() - start)
    windows = {}
    for w in WINDOWS:
        start = time.perf_counter()
        model.forward(0, [token] * w, pos, w)
        windows[w] = (time.perf_counter() - start) * 1000
    model.set_threads(1)
    pin(cores)
    return {"decode": decode, "prefill": prefill, **{f"window{w}_ms": ms for w, ms in windows.items()}}


def llama_turn(bin_dir: Path, path: str, threads: int, cores: list[int]) -> dict:
    """One turn of llama-bench: tg DECODE at depth DEPTH, pp PREFILL, pp4 and pp8."""
    tests = ["-p", f"{PREFILL},{','.join(map(str, WINDOWS))}", "-n", "0", "-r", "1"]
    decode_cmd = [*pinned(cores), str(bin_dir / "llama-bench"), "-m", path, "-t", str(threads), "-p", "0",
                  "-n", str(DECODE), "-d", str(DEPTH), "-r", "1", "-o", "json"]
    rows = parse_bench_json(subprocess.run(decode_cmd, capture_output=True, text=True, check=True).stdout)
    out = {"decode": rows[0]["tokens_per_s"]}
    prefill_cmd = [*pinned(cores), str(bin_dir / "llama-bench"), "-m", path, "-t", str(threads), *tests, "-o", "json"]
    for row in parse_bench_json(subprocess.run(prefill_cmd, capture_output=True, text=True, check=True).stdout):
        n = row["n_prompt"]
        if n == PREFILL:
            out["prefill"] = row["tokens_per_s"]
        else:
            out[f"window{n}_ms"] = n / row["tokens_per_s"] * 1000
    return out


def llama_load_s(bin_dir: Path, path: str, cores: list[int]) -> float | None:
    """llama.cpp's own load time of the file (llama-completion's "load time", one token)."""
    done = subprocess.run(completion_command(bin_dir, path, len(cores), cores), capture_output=True, text=True,
                          check=False)
    for line in (done.stderr + done.stdout).splitlines():
        if "load time" in line:
            return float(line.split("=")[1].split("ms")[0]) / 1000
    return None


def median_of(turns: list[dict]) -> dict:
    return {key: statistics.median(t[key] for t in turns) for key in turns[0]}


def measure(spec: str, thread_counts: list[int], bin_dir: Path) -> dict:
    from hetspec.workers.common.native_model import load_library
    from hetspec.workers.target.native_target import NativeTarget

    found = resolve_model(spec)
    path, cache_root = found.file, os.path.dirname(found.cache_dir) if found.cache_dir else ""
    cores = sorted(os.sched_getaffinity(0))
    load_library(cache_root)        # built once, as on every start but a machine's first
    start = time.perf_counter()
    model = NativeTarget(path, n_ctx=512, caches=1, threads=1, cache_root=cache_root)
    load_s = time.perf_counter() - start
    result = {"model": spec, "file": os.path.basename(path), "bytes": os.path.getsize(path),
              "load_s": load_s, "llama_load_s": llama_load_s(bin_dir, path, cores),
              "kernels": model.description, "threads": {}}
    try:
        for threads in thread_counts:
            use = cores[:threads]
            os.sched_setaffinity(0, use)
            ours, theirs = [], []
            for _ in range(REPS):
                ours.append(hetspec_turn(model, threads, use))
                theirs.append(llama_turn(bin_dir, path, threads, use))
            result["threads"][threads] = {"hetspec": median_of(ours), "llama.cpp": median_of(theirs)}
            print(spec, threads, json.dumps(result["threads"][threads]), flush=True)
    finally:
        os.sched_setaffinity(0, cores)
        model.close()
    return result


def report(results: list[dict], machine: str) -> str:
    lines = [(f"# The native target alone against llama.cpp's own loop\n\nMachine: {machine}. "
             f"Decode: {DECODE} tokens after {DEPTH} (llama-bench tg{DECODE} @ d{DEPTH}); prefill: {PREFILL} "
             f"tokens (pp{PREFILL}); windows: one verify pass of 4 and 8 tokens (pp4, pp8). Medians of {REPS} "
             "alternating turns.\n"),
             ("| model | threads | decode tok/s (hetspec / llama.cpp) | ratio | prefill tok/s | ratio "
             "| window 4 ms | window 8 ms |"), "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for threads, row in r["threads"].items():
            a, b = row["hetspec"], row["llama.cpp"]
            lines.append(f"| {r['file']} | {threads} | {a['decode']:.1f} / {b['decode']:.1f} | "
                         f"**{a['decode'] / b['decode']:.2f}x** | {a['prefill']:.0f} / {b['prefill']:.0f} | "
                         f"{a['prefill'] / b['prefill']:.2f}x | {a['window4_ms']:.0f} / {b['window4_ms']:.0f} | "
                         f"{a['window8_ms']:.0f} / {b['window8_ms']:.0f} |")
    lines += ["", "| model | file MB | hetspec load s | llama.cpp load s | kernels |", "|---|---|---|---|---|"]
    for r in results:
        theirs = f"{r['llama_load_s']:.2f}" if r["llama_load_s"] is not None else "?"
        lines.append(f"| {r['file']} | {r['bytes'] / 1e6:.0f} | {r['load_s']:.1f} | {theirs} | {r['kernels']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="a builtin:NAME or a GGUF path (repeatable)")
    parser.add_argument("--threads", type=int, nargs="+",
                        default=sorted({1, 2, len(os.sched_getaffinity(0))} & set(range(1, 1 + len(os.sched_getaffinity(0))))))
    parser.add_argument("--out", help="folder for report.md and results.json")
    args = parser.parse_args(argv)
    bin_dir = find_binaries()
    if bin_dir is None:
        parser.error(missing_line())
    machine = f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores"
    try:
        with open("/proc/cpuinfo") as f:
            machine = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name")) + \
                f", {len(os.sched_getaffinity(0))} cores"
    except (OSError, StopIteration):
        pass
    results = [measure(spec, args.threads, bin_dir) for spec in (args.model or MODELS)]
    text = report(results, machine)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "report.md").write_text(text)
        Path(args.out, "results.json").write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
