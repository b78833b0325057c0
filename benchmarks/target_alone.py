"""The native target alone against llama-bench on the same GGUF file and cores: at each depth N
(150 by default), the prompt of N tokens read (prefill), decode after it, and verify windows of 4
and 8 tokens there, the two taking turns REPS times (medians), so that both see the machine's drift.
scripts/gpu_check.sh runs it; llama-bench: scripts/build_llama_cpp.sh (`--isa avx2` for AVX2 alone)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from hetspec.benchmarks.bench import llama_bin
from hetspec.benchmarks.bench.machine import affinity, describe_machine, parse_isa
from hetspec.benchmarks.bench.tables import table, write_outputs
from hetspec.core.pinning import pin
from hetspec.models import resolve_model
from hetspec.workers.common.thread_pinning import pin_threads

DEPTHS, DECODE, WINDOWS = (150,), 32, (4, 8)
REPS = 3
MODELS = ("builtin:smollm2", "builtin:gemma3-270m")


def hetspec_turn(model, threads: int, cores: list[int], depth: int) -> dict:
    """One turn of the native target, its threads pinned a core each as the worker pins them: tok/s of a prefill of
    `depth` tokens and of decode after them, and window costs (ms)."""
    model.set_threads(threads)
    pin_threads(cores, threads, model.thread_ids)
    prompt = [int(t) for t in np.random.default_rng(0).integers(100, 5000, depth)]
    start = time.perf_counter()
    token = int(model.forward(0, prompt, 0, 1)[0].argmax())
    out = {"prefill": depth / (time.perf_counter() - start)}
    start = time.perf_counter()
    for pos in range(depth, depth + DECODE):
        token = int(model.forward(0, [token], pos, 1)[0].argmax())
    out["decode"] = DECODE / (time.perf_counter() - start)
    for w in WINDOWS:
        start = time.perf_counter()
        model.forward(0, [token] * w, depth + DECODE, w)
        out[f"window{w}_ms"] = (time.perf_counter() - start) * 1000
    model.set_threads(1)
    pin(cores)
    return out


def llama_turn(bin_dir: Path, path: str, threads: int, cores: list[int], depth: int) -> dict:
    """One turn of llama-bench: tg DECODE at depth `depth`, pp `depth`, then pp4 and pp8 at that depth."""
    no_repack = [] if llama_bin.repacks(path) else ["--repack", "0"]

    def bench(*args: str) -> list[dict]:
        command = [*llama_bin.pinned(cores), str(bin_dir / "llama-bench"), "-m", path, "-t", str(threads), *args,
                   "-r", "1", "-o", "json", *no_repack]
        return llama_bin.parse_bench_json(subprocess.run(command, capture_output=True, text=True, check=True).stdout)

    out = {"decode": bench("-p", "0", "-n", str(DECODE), "-d", str(depth))[0]["tokens_per_s"],
           "prefill": bench("-n", "0", "-p", str(depth))[0]["tokens_per_s"]}
    for row in bench("-n", "0", "-p", ",".join(map(str, WINDOWS)), "-d", str(depth)):
        out[f"window{row['n_prompt']}_ms"] = row["n_prompt"] / row["tokens_per_s"] * 1000
    return out


def measure(spec: str, thread_counts: list[int], depths: list[int], bin_dir: Path) -> dict:
    from hetspec.workers.common.native_model import load_library
    from hetspec.workers.target.native_target import NativeTarget

    found, cores = resolve_model(spec), affinity()
    path, cache_root = found.file, os.path.dirname(found.cache_dir) if found.cache_dir else ""
    load_library(cache_root)        # the kernels built before the load is timed
    done = subprocess.run(llama_bin.completion_command(bin_dir, path, len(cores), cores), capture_output=True,
                          text=True, check=False)
    try:                            # llama.cpp's own load time of the file (llama-completion's, one token)
        llama_load_s = llama_bin.parse_load_ms(done.stderr + done.stdout) / 1000
    except ValueError:
        llama_load_s = None
    start = time.perf_counter()
    model = NativeTarget(path, n_ctx=max(depths) + DECODE + 2 * max(WINDOWS) + 64, caches=1, threads=1,
                         cache_root=cache_root)
    result = {"model": spec, "file": os.path.basename(path), "bytes": os.path.getsize(path),
              "load_s": time.perf_counter() - start, "llama_load_s": llama_load_s, "kernels": model.description,
              "threads": {}}
    try:
        for threads in thread_counts:
            use = cores[:threads]
            os.sched_setaffinity(0, use)
            for depth in depths:
                ours, theirs = zip(*[(hetspec_turn(model, threads, use, depth),
                                      llama_turn(bin_dir, path, threads, use, depth)) for _ in range(REPS)])
                row = {side: {key: statistics.median(t[key] for t in turns) for key in turns[0]}
                       for side, turns in (("hetspec", ours), ("llama.cpp", theirs))}
                result["threads"].setdefault(threads, {})[depth] = row
                print(spec, threads, depth, json.dumps(row), flush=True)
    finally:
        os.sched_setaffinity(0, cores)
        model.close()
    return result


def report(results: list[dict], machine: str) -> str:
    rows = []
    for r in results:
        for threads, by_depth in r["threads"].items():
            for depth, row in by_depth.items():
                a, b = row["hetspec"], row["llama.cpp"]
                rows.append([r["file"], str(threads), str(depth), f"{a['decode']:.1f} / {b['decode']:.1f}",
                             f"**{a['decode'] / b['decode']:.2f}x**", f"{a['prefill']:.0f} / {b['prefill']:.0f}",
                             f"{a['prefill'] / b['prefill']:.2f}x", f"{a['window4_ms']:.0f} / {b['window4_ms']:.0f}",
                             f"{a['window8_ms']:.0f} / {b['window8_ms']:.0f}"])
    loads = [[r["file"], f"{r['bytes'] / 1e6:.0f}", f"{r['load_s']:.1f}",
              "?" if r["llama_load_s"] is None else f"{r['llama_load_s']:.2f}", r["kernels"]] for r in results]
    about = (f"Machine: {machine}. At each depth N: prefill, a prompt of N tokens read (llama-bench pp N); decode, "
             f"{DECODE} tokens after it (tg{DECODE} @ d N); windows, one verify pass of 4 and 8 tokens there "
             f"(pp4, pp8 @ d N). Medians of {REPS} alternating turns.")
    return "\n".join(["# The native target alone against llama.cpp's own loop", "", about, "",
                      *table(["model", "threads", "depth", "decode tok/s (hetspec / llama.cpp)", "ratio",
                              "prefill tok/s", "ratio", "window 4 ms", "window 8 ms"], rows), "",
                      *table(["model", "file MB", "hetspec load s", "llama.cpp load s", "kernels"], loads)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    cores = len(affinity())
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="a builtin:NAME or a GGUF path (repeatable)")
    parser.add_argument("--threads", type=int, nargs="+", default=sorted({t for t in (1, 2, cores) if t <= cores}))
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS),
                        help="context lengths: the prompt read, then decode and windows after it (default: 150)")
    parser.add_argument("--out", help="folder for report.md and results.json")
    args = parse_isa(parser, argv)
    bin_dir = llama_bin.find_binaries()
    if bin_dir is None:
        parser.error(llama_bin.missing_line())
    described = describe_machine()
    machine = f"{described['cpu']}, {cores} cores ({described['isa']})"
    results = [measure(spec, args.threads, args.depths, bin_dir) for spec in (args.model or MODELS)]
    text = report(results, machine)
    print(text)
    if args.out:
        write_outputs(args.out, {"machine": machine, "results": results}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
