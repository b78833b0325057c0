"""The transformers target's attention over grouped KV heads, three ways in turn in one process:
transformers' SDPA path with the heads repeated (repeat_kv), with 5.24's TRANSFORMERS_SDPA_FORCE_GQA
switch, and hetspec's (workers/target/attention.py); an 8-token pass after 700 positions.

    python -m hetspec.benchmarks.grouped_attention_ab [--model builtin:smollm2] [--threads 1] [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None) -> None:
    import torch

    from hetspec.models import resolve_model
    from hetspec.workers.common.hf_loading import load_causal_lm
    from hetspec.workers.common.kv_model import KVModel
    from hetspec.workers.target.attention import NAME

    p = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.grouped_attention_ab", description=__doc__)
    p.add_argument("--model", default="builtin:smollm2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_causal_lm(resolve_model(args.model, "target"), "float32", "cpu")
    kv = KVModel(lm)
    kv.forward(list(range(100, 800)), 0, all_logits=False)
    ways = {"repeated (repeat_kv)": ("sdpa", "0"), "TRANSFORMERS_SDPA_FORCE_GQA": ("sdpa", "1"), "hetspec": (NAME, "0")}
    times, logits = {way: [] for way in ways}, {}
    for _ in range(args.repeats):
        for way, (impl, switch) in ways.items():
            lm.config._attn_implementation, os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = impl, switch
            start = time.perf_counter()
            logits[way] = kv.forward(list(range(5, 13)), 700)
            times[way].append(time.perf_counter() - start)
    for way, seconds in times.items():
        print(f"{way}: {1e3 * statistics.median(seconds):.1f} ms (median of {args.repeats})")
    same = torch.equal(logits["hetspec"], logits["TRANSFORMERS_SDPA_FORCE_GQA"])
    print(f"hetspec's logits {'are' if same else 'are not'} the switch's bit for bit")


if __name__ == "__main__":
    main()
