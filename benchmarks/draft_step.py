"""The native draft's one-token step by thread count and weight bits: what a draft token
costs where it has the machine's cores (beside a GPU target, or a paced one).

    python -m hetspec.benchmarks.draft_step [--model builtin:qwen2.5-coder-0.5b] [--threads 1 2] [--repeats 3]
        [--isa avx2]

Each setting times 12 steps after a 128-token context, its threads pinned one a core
(the first cores), the settings taking turns; prints each setting's median step, the
median over the repeats.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from hetspec.benchmarks.bench.machine import add_isa_option, use_isa
from hetspec.models import resolve_model
from hetspec.workers.common.native_model import NativeModel
from hetspec.workers.common.thread_pinning import pin_threads

CONTEXT, STEPS = 128, 12


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.draft_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=0, help="also 4-bit layers scoring only the first N tokens")
    add_isa_option(parser)
    args = parser.parse_args(argv)
    use_isa(args.isa)
    cores = sorted(os.sched_getaffinity(0))
    path = resolve_model(args.model, "draft").file
    models = {"8-bit layers": NativeModel(path, 1024), "4-bit layers": NativeModel(path, 1024, four_bit=True),
              "4-bit layers in row tiles": NativeModel(path, 1024, four_bit=True, tiles=True)}
    if args.vocab:
        models[f"4-bit layers, first {args.vocab} tokens"] = NativeModel(path, 1024, four_bit=True, vocab=args.vocab)
    rng = np.random.default_rng(0)
    for model in models.values():
        model.forward(rng.integers(0, 1000, CONTEXT), 0)
    medians: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for name, model in models.items():
            for threads in args.threads:
                medians.setdefault((name, threads), []).append(_median_step(model, cores, threads, rng))
    for (name, threads), seconds in medians.items():
        print(f"{args.model}, {name}, {threads} thread(s): {1000 * np.median(seconds):.1f} ms a step "
              f"(repeats: {', '.join(f'{1000 * s:.1f}' for s in seconds)})")
    return 0


def _median_step(model: NativeModel, cores: list[int], threads: int, rng) -> float:
    threads = model.set_threads(threads)
    pin_threads(cores[:threads], threads, model.thread_ids)
    times = []
    for pos in range(CONTEXT, CONTEXT + STEPS):
        start = time.perf_counter()
        model.forward([int(rng.integers(0, 1000))], pos)
        times.append(time.perf_counter() - start)
    model.rest()
    return float(np.median(times))


if __name__ == "__main__":
    raise SystemExit(main())
