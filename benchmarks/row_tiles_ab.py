"""The native target with its matrices in row tiles (FMT_T*, what it holds wherever a matrix's
rows make tiles) against the same file without them (EXACT_LAYOUTS: FMT_K4, FMT_K6, Q4_1 and
Q8_0 as stored, FMT_Q5), in one process, the two taking turns so that the machine's drift
falls on both alike. On AVX2 (`--isa avx2` on any machine) it measures what window_avx2.c's
row tiles gain.

    python -m hetspec.benchmarks.row_tiles_ab [--model builtin:qwen2.5-coder-1.5b] [--threads 1 2]
        [--isa avx2] [--turns 3]

Per thread count: a pass of one token after a 150-token context (decode), four requests'
tokens in one pass (a batch step), a verify window of 8, and a 64-token prompt chunk; each the
median of its turns' medians. The two layouts' logits differ in the last bits (their float
steps run in another order); each is batch-invariant on its own (tests/test_native_target.py).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from hetspec.benchmarks.bench.machine import add_isa_option, describe_machine, use_isa
from hetspec.models import resolve_model
from hetspec.workers.common.pinning import pin_threads

CONTEXT, CACHES, REPEATS = 150, 4, 5


def load(path: str, tiles: bool, threads: int):
    """A NativeTarget whose model holds its matrices in row tiles or not (window_layout)."""
    from hetspec.workers.common.native_model import NativeModel
    from hetspec.workers.target.native_target import NativeTarget

    made = NativeModel.__init__
    NativeModel.__init__ = lambda self, *a, **k: made(self, *a, **{**k, "window_layout": tiles})
    try:
        return NativeTarget(path, n_ctx=CONTEXT + 128, caches=CACHES, threads=threads)
    finally:
        NativeModel.__init__ = made


def timings(target, rng) -> dict[str, float]:
    """ms of each pass, the median of REPEATS (every cache holding CONTEXT tokens first)."""
    draw = lambda n: [int(t) for t in rng.integers(10, 5000, n)]
    for cache in range(CACHES):
        target.forward(cache, draw(CONTEXT), 0, 1)
    passes = {"decode": lambda: target.forward(0, draw(1), CONTEXT, 1),
              "batch of 4": lambda: target.forward_batch([(c, draw(1), CONTEXT, 1) for c in range(CACHES)]),
              "window of 8": lambda: target.forward(0, draw(8), CONTEXT, 8),
              "prompt chunk of 64": lambda: target.forward(1, draw(64), CONTEXT, 1)}
    out = {}
    for name, run in passes.items():
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        out[name] = 1e3 * float(np.median(times))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.row_tiles_ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--turns", type=int, default=3)
    add_isa_option(parser)
    args = parser.parse_args(argv)
    use_isa(args.isa)
    path = resolve_model(args.model, "target").file
    cores = sorted(os.sched_getaffinity(0))
    targets = {"row tiles": load(path, True, 1), "without": load(path, False, 1)}
    print(f"{args.model} on {describe_machine(gpu=False)['cpu']} ({describe_machine(gpu=False)['isa']})")
    for name, target in targets.items():
        print(f"  {name}: {target.description}")
    rng = np.random.default_rng(0)
    for threads in args.threads:
        turns = {name: [] for name in targets}
        for _ in range(args.turns):
            for name, target in targets.items():
                target.set_threads(threads)
                pin_threads(cores[:threads], threads, target._net.thread_ids)
                turns[name].append(timings(target, rng))
                target.set_threads(1)
        print(f"{threads} thread(s), ms a pass (median of {args.turns} turns):")
        for what in turns["row tiles"][0]:
            a, b = (float(np.median([t[what] for t in turns[name]])) for name in targets)
            print(f"  {what}: row tiles {a:.1f}, without {b:.1f}: {b / a:.2f}x")
    for target in targets.values():
        target.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
