"""A target on a GPU, measured: the verify costs the engine calibrates and the budget it picks,
the same model's plain `generate` there, and where each mode's rounds' time goes with a CPU draft.

    python -m hetspec.benchmarks.gpu_profile [--target SPEC] [--draft SPEC] [--dtype bfloat16]
        [--tokens 64] [--prompts 3] [--out FILE.json]

The defaults are random models shaped as Llama 2 7B and the paper's 68M Llama draft: acceptance
means nothing, the costs are the point. Needs CUDA; prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

LLAMA2_7B = "random:vocab=32000,hidden=4096,layers=32,heads=32,intermediate=11008,seed=0,init=device"
LLAMA_68M = "random:vocab=32000,hidden=768,layers=2,heads=12,intermediate=3072,seed=1"
MODES = [("target", "auto"), ("sequential", "always"), ("duodec", "always")]
COUNTED = ("rounds", "spec_rounds", "drafted", "accepted")       # summed over a mode's requests, as they are


def engine_config(target: str, draft: str, dtype: str) -> dict:
    return {"target": {"model": target, "device": "cuda", "dtype": dtype},
            "draft": {"backend": "torch" if draft.startswith("random") else "native", "model": draft},
            "server": {"max_context": 1024}}


def prompts(n: int, vocab: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, 32 + 48 * i).tolist() for i in range(n)]


def profile_modes(engine, ids: list[list[int]], tokens: int, gamma: int) -> dict:
    """Per mode: tokens/s, and a speculative round's draft, verify, wall and overhead ms from the engine's
    statistics; the speculative modes draft `gamma` tokens a round however few are accepted."""
    out = {}
    for mode, speculation in MODES:
        fixed = {} if mode == "target" else {"gamma": gamma}
        engine.generate(ids[0], max_new_tokens=8, mode=mode, speculation=speculation, **fixed)   # warm-up
        totals = Counter()
        for prompt in ids:
            start = time.perf_counter()
            stats = engine.generate(prompt, max_new_tokens=tokens, mode=mode, speculation=speculation,
                                    cache_prompt=False, **fixed).stats
            totals["wall"] += time.perf_counter() - start
            totals.update({key: stats[key] for key in (*COUNTED, "new_tokens", "draft_s", "verify_s", "round_s",
                                                       "overhead_s")})
        spec = max(1, totals["spec_rounds"])
        out[mode] = {"tokens_per_s": round(totals["new_tokens"] / totals["wall"], 1),
                     **{key: totals[key] for key in COUNTED},
                     "ms_per_spec_round": {k: round(1e3 * totals[f"{k}_s"] / spec, 2)
                                           for k in ("draft", "verify", "round", "overhead")}}
    return out


def in_process(target: str, dtype: str, ids: list[list[int]], tokens: int) -> dict:
    """The target in this process: its passes through the engine's KV cache, and its greedy `generate`
    (the user's alternative on a GPU)."""
    import torch

    from hetspec.models import resolve_model
    from hetspec.workers.common.hf_loading import load_causal_lm
    from hetspec.workers.common.kv_model import KVModel

    model = load_causal_lm(resolve_model(target), dtype, "cuda")
    doc = {"kv_model_ms": _kv_model_passes(KVModel(model, "cuda"), ids[-1], tokens)}
    doc["generate"] = _generate(model, ids, tokens)
    del model
    torch.cuda.empty_cache()
    return doc


def _kv_model_passes(kv, prompt: list[int], tokens: int) -> dict:
    """ms of a pass (median, fastest): steps of one token, then windows of n re-run at one position."""
    import numpy as np

    kv.forward(prompt, 0, all_logits=False)
    steps = []
    for i in range(tokens):
        start = time.perf_counter()
        kv.forward([7], len(prompt) + i, all_logits=False)[-1, 0].item()
        steps.append(time.perf_counter() - start)
    ms = lambda times: [round(1e3 * float(np.median(times)), 2), round(1e3 * min(times), 2)]
    out = {"step": ms(steps)}
    for n in (2, 4, 8, 16, 32):
        times = []
        for _ in range(8):
            start = time.perf_counter()
            kv.forward(list(range(1, n + 1)), len(prompt), all_logits=True)[-1, 0].item()
            times.append(time.perf_counter() - start)
        out[f"window {n}"] = ms(times)
    return out


def _generate(model, ids: list[list[int]], tokens: int) -> dict:
    import torch

    new = wall = 0.0
    for i, prompt in enumerate([ids[0], *ids]):
        x = torch.tensor([prompt], device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=False, num_beams=1, pad_token_id=0)
        torch.cuda.synchronize()
        if i:                                  # the first run warms up
            new += out.shape[1] - len(prompt)
            wall += time.perf_counter() - start
    return {"tokens_per_s": round(new / wall, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.gpu_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=LLAMA2_7B)
    p.add_argument("--draft", default=LLAMA_68M)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)

    import torch

    import hetspec

    if not torch.cuda.is_available():
        print("gpu_profile: no CUDA GPU", file=sys.stderr)
        return 2
    doc = {"gpu": torch.cuda.get_device_name(0), "target": args.target, "draft": args.draft, "dtype": args.dtype}
    with hetspec.launch(engine_config(args.target, args.draft, args.dtype)) as engine:
        info = engine.get_info()
        ids = prompts(args.prompts, info["n_vocab"])
        budget = info["budget"]
        doc.update(gamma=info["gamma"], keep_drafting=info["keep_drafting"], target_kernels=info["target"]["kernels"],
                   draft_cores=info["draft"]["cores"], load_s=info["target"]["load_s"],
                   verify_ms={k: round(1e3 * v, 2) for k, v in budget.get("verify_s", {}).items()},
                   draft_ms_per_token=round(1e3 * budget.get("draft_s_per_token", 0.0), 2))
        doc["modes"] = profile_modes(engine, ids, args.tokens, info["gamma"])
    doc.update(in_process(args.target, args.dtype, ids, args.tokens))
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
