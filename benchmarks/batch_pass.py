"""The native target's pass over several requests at once (NativeTarget.forward_batch): what
a batch of B requests' windows of w tokens costs against one request's one-token step,
i.e. how many more tokens a pass verifies in the same time (#60's premise).

    python -m hetspec.benchmarks.batch_pass [--model builtin:smollm2] [--threads 1] [--batches 1 2 4 8]
        [--windows 1 4] [--repeats 9]

Every request's cache holds a 128-token context; each setting's median pass over
--repeats passes, the settings in turn. Pin it (taskset) for steady figures.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from hetspec.models import resolve_model
from hetspec.workers.target.native_target import NativeTarget

CONTEXT = 128


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.batch_pass", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    target = NativeTarget(resolve_model(args.model, "target").file, n_ctx=CONTEXT + 2 * max(args.windows),
                          caches=max(args.batches), threads=args.threads)
    rng = np.random.default_rng(0)
    for cache in range(target.caches):
        target.forward(cache, rng.integers(10, 5000, CONTEXT), 0, 1)

    def ms(batch: int, window: int) -> float:
        times = []
        for _ in range(args.repeats):
            windows = [(cache, rng.integers(10, 5000, window), CONTEXT, window) for cache in range(batch)]
            start = time.perf_counter()
            target.forward_batch(windows)
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times))

    ms(1, 1)                                  # a warm-up: the first passes read cold memory
    step = ms(1, 1)
    print(f"{args.model}, {target.threads} thread(s): one request's one-token pass {step:.1f} ms")
    for window in args.windows:
        for batch in args.batches:
            cost = ms(batch, window)
            print(f"  {batch} request(s) x {window} token(s): {cost:.1f} ms = {cost / step:.2f}x the step; "
                  f"{batch * window * step / cost:.2f}x its tokens a second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
