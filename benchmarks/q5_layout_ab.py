"""Q5_0 read at its own size (FMT_Q5) against held as the Q8_0 of the same values, in the
native target, on one GGUF file: both layouts loaded in one process, taking turns
(target_alone's turn: decode after 150 tokens, prefill, windows of 4 and 8), threads
pinned a core each; medians of REPS. The logits are checked to be the same bits.

    python -m hetspec.benchmarks.q5_layout_ab FILE.gguf [--threads 1 2]
"""
from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from hetspec.benchmarks.target_alone import hetspec_turn
from hetspec.models import resolve_model
from hetspec.workers.draft import native
from hetspec.workers.target.native_target import NativeTarget

REPS = 3


def load(path: str, cache_root: str, own_size: bool) -> NativeTarget:
    """The native target with Q5_0 in FMT_Q5 (own_size) or as Q8_0 (_mat's inexact path, exact for Q5_0)."""
    if own_size:
        return NativeTarget(path, 512, 1, 1, cache_root)
    plain = native._mat

    def as_q8_0(w, name):
        tensor = w.tensors.get(name)
        return plain(w._replace(exact=False) if tensor is not None and tensor.type_name == "Q5_0" else w, name)

    native._mat = as_q8_0
    try:
        return NativeTarget(path, 512, 1, 1, cache_root)
    finally:
        native._mat = plain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a GGUF file with Q5_0 matrices")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    found = resolve_model(args.model)
    cache_root = os.path.dirname(found.cache_dir) if found.cache_dir else ""
    models = {"Q5_0 own size": load(found.file, cache_root, True), "Q5_0 as Q8_0": load(found.file, cache_root, False)}
    tokens = list(range(100, 140))
    first, second = (m.forward(0, tokens, 0, len(tokens)).view(np.uint32) for m in models.values())
    print("same logits, bit for bit:", np.array_equal(first, second))
    cores = sorted(os.sched_getaffinity(0))
    for threads in args.threads:
        turns = {name: [] for name in models}
        for _ in range(REPS):
            for name, model in models.items():
                turns[name].append(hetspec_turn(model, threads, cores[:threads]))
        for name, rows in turns.items():
            print(threads, name, {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
