"""The native target's K-quant layouts on a real file, in one process: Q4_K and Q6_K in 4
and 6 bits (FMT_N4, FMT_N6, what the target holds with AVX-512 VNNI where a matrix's rows
are not whole row tiles) against the int8 expansion they replaced (FMT_I8). Checks that both give the same logits bits, then times
their passes taking turns, so that the machine's drift falls on both alike.

    python -m hetspec.benchmarks.kquant_layouts [--model builtin:qwen2.5-coder-1.5b] [--threads 1]
        [--batches 1 4] [--windows 1 4] [--repeats 7] [--turns 3]

Exits 1 if the logits differ, 2 where the CPU lacks AVX-512 VNNI (the layouts are not made).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from hetspec.models import resolve_model
from hetspec.workers.common import native_weights
from hetspec.workers.target.native_target import NativeTarget

CONTEXT = 128


def load(path: str, layout, caches: int, threads: int) -> tuple[NativeTarget, float]:
    """A target with Q4_K and Q6_K held by `layout`, and the GB of arrays it holds."""
    saved = {fmt: native_weights.WINDOW_LAYOUTS[fmt] for fmt in ("Q4_K", "Q6_K")}
    native_weights.WINDOW_LAYOUTS.update(Q4_K=layout, Q6_K=layout)
    try:
        target = NativeTarget(path, n_ctx=CONTEXT + 64, caches=caches, threads=threads)
    finally:
        native_weights.WINDOW_LAYOUTS.update(saved)
    return target, sum(a.nbytes for a in target._net._arrays if isinstance(a, np.ndarray)) / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.kquant_layouts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args(argv)
    path = resolve_model(args.model, "target").file
    packed, packed_gb = load(path, native_weights._nibbles, max(args.batches), args.threads)
    if not packed._lib.hs_pair_layout():
        print("this CPU lacks AVX-512 VNNI: the target reads Q4_K and Q6_K at their own size (FMT_K4, FMT_K6)")
        return 2
    expanded, expanded_gb = load(path, native_weights._int8, max(args.batches), args.threads)
    print(f"{args.model}: {packed.description}; arrays {packed_gb:.2f} GB in 4/6 bits, {expanded_gb:.2f} GB as int8")
    rng = np.random.default_rng(0)
    prompt = rng.integers(10, 5000, CONTEXT)
    same = all(np.array_equal(packed.forward(cache, prompt, 0, CONTEXT).view(np.uint32),
                              expanded.forward(cache, prompt, 0, CONTEXT).view(np.uint32))
               for cache in range(max(args.batches)))
    print(f"logits of a {CONTEXT}-token prompt, every row: {'the same bits' if same else 'DIFFERENT'}")

    def ms(target: NativeTarget, batch: int, window: int) -> float:
        times = []
        for _ in range(args.repeats):
            windows = [(cache, rng.integers(10, 5000, window), CONTEXT, window) for cache in range(batch)]
            start = time.perf_counter()
            target.forward_batch(windows)
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times))

    for window in args.windows:
        for batch in args.batches:
            turns = [(ms(packed, batch, window), ms(expanded, batch, window)) for _ in range(args.turns)]
            a, b = (np.median([turn[i] for turn in turns]) for i in (0, 1))
            print(f"  {batch} request(s) x {window} token(s): 4/6 bits {a:.1f} ms, int8 {b:.1f} ms: {b / a:.2f}x "
                  f"(turns: {', '.join(f'{x:.0f}/{y:.0f}' for x, y in turns)})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
