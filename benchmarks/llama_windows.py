"""What a verify window costs on the GGUF targets: llama.cpp's, with hetspec's output layer
and with llama.cpp's, and the native target (hetspec's kernels throughout).

    python -m hetspec.benchmarks.llama_windows [--model builtin:gemma3-270m] [--threads 1]

Each window (every row's logits, as verification asks) is timed after a 256-token
context, fastest of 5, in one process, alternating the targets (with --threads N,
each compute thread pinned to a core of its own); the rows of the two
llama.cpp targets must be equal bit for bit (both compute llama.cpp's Q8_0 arithmetic;
the native target rounds activations otherwise). Another line asks llama.cpp for the
last row's logits only: the window's body, nearly.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from hetspec.models import resolve_model
from hetspec.workers.common.pinning import pin_threads
from hetspec.workers.target.llama_target import LlamaTarget
from hetspec.workers.target.native_target import NativeTarget

CONTEXT, WINDOWS, REPEATS = 256, (1, 2, 4, 8, 16, 32), 5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.llama_windows", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:gemma3-270m")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    path = resolve_model(args.model).file
    targets = {"hetspec's output layer": LlamaTarget(path, 512, 1, args.threads),
               "llama.cpp's output layer": LlamaTarget(path, 512, 1, args.threads, own_output_layer=False),
               "native target": NativeTarget(path, 512, 1, args.threads)}
    if args.threads > 1:       # each compute thread on a core of its own, as the engine pins them
        pin_threads(sorted(os.sched_getaffinity(0))[:args.threads], args.threads, targets["native target"].thread_ids)
    try:
        if next(iter(targets.values())).head is None:
            raise SystemExit(f"{args.model}: hetspec keeps llama.cpp's output layer ({next(iter(targets.values())).head_why})")
        rng = np.random.default_rng(0)
        context = rng.integers(10, 5000, CONTEXT)
        for target in targets.values():
            target.forward(0, context, 0, 1)
        body = "llama.cpp, the last row's logits only"
        best = {name: {} for name in [*targets, body]}
        for n in WINDOWS:
            window = rng.integers(10, 5000, n)
            rows = {}
            for _ in range(REPEATS):
                for name, target in targets.items():
                    start = time.perf_counter()
                    rows[name] = target.forward(0, window, CONTEXT, n)
                    elapsed = time.perf_counter() - start
                    best[name][n] = min(best[name].get(n, elapsed), elapsed)
                start = time.perf_counter()
                targets["llama.cpp's output layer"].forward(0, window, CONTEXT, 1)
                elapsed = time.perf_counter() - start
                best[body][n] = min(best[body].get(n, elapsed), elapsed)
            first, second, _ = rows.values()
            if not np.array_equal(first.view(np.uint32), second.view(np.uint32)):
                raise SystemExit(f"a window of {n}: the two output layers' logits differ")
        print(f"{args.model}, {args.threads} thread(s), {CONTEXT}-token context; ms by window (every row's logits):")
        for name, times in best.items():
            print(f"  {name}: " + ", ".join(f"{n}: {s * 1000:.1f}" for n, s in times.items()))
        print("  logits equal bit for bit in every window")
    finally:
        for target in targets.values():
            target.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
