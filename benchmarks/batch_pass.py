"""A target's pass over several requests at once: what a batch of B requests' windows of w
tokens costs against one request's one-token step, i.e. how many more tokens a pass
verifies in the same time (#60's premise). The native target (NativeTarget.forward_batch),
or with --backend transformers a transformers model's eager or static passes packed into one
(workers/target/packed_pass.py) or its captured passes' batch pass (captured.py: every
cache's row, recorded as a CUDA graph on a GPU, run as it is here), there also against the
same windows run one after another.

    python -m hetspec.benchmarks.batch_pass [--model builtin:smollm2] [--threads 1] [--batches 1 2 4 8]
        [--windows 1 4] [--repeats 9] [--backend native|transformers] [--passes eager|static|captured]

Every request's cache holds a 128-token context; each setting's median pass over
--repeats passes, the settings in turn. Pin it (taskset) for steady figures.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from hetspec.models import resolve_model

CONTEXT = 128


def transformers_passes(args, caches: int):
    """(forward, forward_batch) of a transformers model's KV model, float32, on the CPU."""
    import torch

    from hetspec.workers.common.hf_loading import load_causal_lm
    from hetspec.workers.common.kv_model import KVModel, StaticKVModel
    from hetspec.workers.target.captured import CapturedKVModel
    from hetspec.workers.target.packed_pass import forward_batch

    torch.set_num_threads(args.threads)
    lm = load_causal_lm(resolve_model(args.model, "target"), "float32", "cpu")
    n_ctx = CONTEXT + 2 * max(args.windows)
    kv = {"eager": lambda: KVModel(lm), "static": lambda: StaticKVModel(lm, "cpu", n_ctx, 8),
          "captured": lambda: CapturedKVModel(lm, "cpu", n_ctx, 8, caches)}[args.passes]()
    batch = kv.forward_batch if args.passes == "captured" else lambda windows: forward_batch(kv, windows)

    def forward(cache, tokens, keep, rows):
        kv.use(cache)
        return kv.forward(list(tokens), keep)[-rows:]
    return forward, lambda windows: batch([(c, list(t), k, r) for c, t, k, r in windows])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.batch_pass", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--backend", choices=["native", "transformers"], default="native")
    parser.add_argument("--passes", choices=["eager", "static", "captured"], default="eager")
    args = parser.parse_args(argv)
    if args.backend == "native":
        from hetspec.workers.target.native_target import NativeTarget

        target = NativeTarget(resolve_model(args.model, "target").file, n_ctx=CONTEXT + 2 * max(args.windows),
                              caches=max(args.batches), threads=args.threads)
        forward, batched = target.forward, target.forward_batch
    else:
        forward, batched = transformers_passes(args, max(args.batches))
    one_by_one = lambda windows: [forward(*window) for window in windows]
    rng = np.random.default_rng(0)
    for cache in range(max(args.batches)):
        forward(cache, rng.integers(10, 5000, CONTEXT), 0, 1)

    def ms(batch: int, window: int, run=batched) -> float:
        times = []
        for _ in range(args.repeats):
            windows = [(cache, rng.integers(10, 5000, window), CONTEXT, window) for cache in range(batch)]
            start = time.perf_counter()
            run(windows)
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times))

    ms(1, 1)                                  # a warm-up: the first passes read cold memory
    step = ms(1, 1)
    print(f"{args.model}, {args.backend}, {args.threads} thread(s): one request's one-token pass {step:.1f} ms")
    for window in args.windows:
        for batch in args.batches:
            cost = ms(batch, window)
            print(f"  {batch} request(s) x {window} token(s): {cost:.1f} ms = {cost / step:.2f}x the step; "
                  f"{batch * window * step / cost:.2f}x its tokens a second"
                  + (f"; one after another {ms(batch, window, one_by_one):.1f} ms" if args.backend != "native" else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
