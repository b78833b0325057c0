"""A target on a GPU, measured: what a pass costs the host and the GPU, run eagerly, on a static
cache and captured (CUDA graphs); a captured pass's cost against the context it holds; the
engine's rounds around it with a CPU draft, its passes eager and captured, and its start-up;
several requests' windows in one packed pass against their captured passes; the same model's
plain `generate`; and a paced profile (hetspec.core.gpu_profiles) drawn from the captured
curve, so that the paced target can charge measured numbers.

    python -m hetspec.benchmarks.gpu_profile [--device cuda|cpu] [--target SPEC] [--draft SPEC]
        [--dtype bfloat16] [--context 256] [--tokens 64] [--budget-s 300] [--out FILE.json] [--report FILE.md]

On CUDA the defaults are random models shaped as Qwen2.5 7B (grouped-query attention, a
152k vocabulary; weights drawn on the GPU) and a 2-layer draft of its vocabulary on the CPU:
acceptance means nothing, the costs are the point, and a lent machine fetches no weights.
`--device cpu` rehearses every step with tiny shapes in well under a minute; there the
profiler's CPU times stand in for kernel times. Steps run in order of value (curve, context,
engine, batch, generate), the JSON written after each: a crash loses only the step it was in.
A step that would start after `--budget-s` is skipped and named under "skipped".
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from hetspec.benchmarks.gpu_passes import SIZES, batch_curve, context_curve, curve, paced_profile, sync

SHAPES = {   # device: target, draft, dtype, context, tokens, prompts, repeats
    "cuda": ("random:vocab=152064,hidden=3584,layers=28,heads=28,kv_heads=4,intermediate=18944,seed=0,init=device",
             "random:vocab=152064,hidden=768,layers=2,heads=12,intermediate=3072,seed=1", "bfloat16", 256, 64, 3, 10),
    "cpu": ("random:vocab=320,hidden=64,layers=2,heads=4,kv_heads=2,seed=0",
            "random:vocab=320,hidden=64,layers=1,heads=4,seed=1", "float32", 32, 12, 2, 3),
}
GAMMA = 4                        # the forced speculative rounds' window
MODES = [("target", "auto"), ("duodec", "always")]
COUNTED = ("rounds", "spec_rounds", "drafted", "accepted", "new_tokens", "draft_s", "verify_s", "round_s", "overhead_s")


def load(args):
    from hetspec.models import resolve_model
    from hetspec.workers.common.hf_loading import load_causal_lm

    return load_causal_lm(resolve_model(args.target), args.dtype, args.device)


def due(args, doc: dict, what: str) -> bool:
    """Whether step `what` runs: chosen (--steps) and starting within the budget (else named as skipped)."""
    if what.split()[0] not in args.steps:
        return False
    if time.perf_counter() < args.deadline:
        return True
    doc["skipped"].append(what)
    return False


def save(args, doc: dict) -> None:
    """The JSON as it stands (after each step: a crash in the next loses only that one)."""
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))


def load_target(args):
    """The target as the worker loads it: its dtype, and grouped-query attention unrepeated."""
    from hetspec.workers.target.attention import use_grouped_attention

    lm = load(args)
    use_grouped_attention(lm)
    return lm


def curves(args, ids: list[list[int]], doc: dict) -> None:
    """The target in this process: its pass curves (eager, static, captured), then the captured
    pass against context."""
    import torch

    from hetspec.workers.common.kv_model import KVModel, StaticKVModel
    from hetspec.workers.target.captured import CapturedKVModel

    lm = load_target(args)
    for passes, kind in [("captured", CapturedKVModel), ("eager", KVModel), ("static", StaticKVModel)]:
        if not due(args, doc, f"curve {passes}"):
            continue
        kv = kind(lm, args.device, *([] if kind is KVModel else [args.context + 2 * SIZES[-1], SIZES[-1]]))
        doc["curve"][passes] = curve(kv, args.device, ids[0], args.repeats, doc["curve"].get("eager"))
        if passes == "captured":
            doc["curve"][passes]["graphs"] = kv.fallback or ("CUDA graphs" if kv.graphs else "run eagerly (no CUDA)")
        del kv
        save(args, doc)
    if due(args, doc, "context"):
        doc["by_context"] = context_curve(lm, args)
        save(args, doc)
    del lm
    if args.device == "cuda":
        torch.cuda.empty_cache()


def after_engine(args, ids: list[list[int]], doc: dict) -> None:
    """The target in this process again: the batch curve, and its eager `generate`."""
    import torch

    lm = load_target(args) if args.steps & {"batch", "generate"} else None
    if due(args, doc, "batch"):
        doc["batch"] = batch_curve(lm, args, ids[0])
        save(args, doc)
    if due(args, doc, "generate eager"):
        doc["generate"]["eager"] = generate(lm, ids, args.tokens, args.device)
        save(args, doc)
    del lm
    if args.device == "cuda":
        torch.cuda.empty_cache()


def generate(lm, ids: list[list[int]], tokens: int, device: str, **how) -> dict:
    """tokens/s of greedy `generate` over the prompts after a warm-up run (where a static cache's
    step compiles), and that first run's seconds."""
    import torch

    new = wall = first = 0.0
    for i, prompt in enumerate([ids[0], *ids]):
        x = torch.tensor([prompt], device=device)
        sync(device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False, num_beams=1, pad_token_id=0, **how)
        sync(device)
        if i:
            new, wall = new + out.shape[1] - len(prompt), wall + time.perf_counter() - start
        else:
            first = time.perf_counter() - start
    return {"tokens_per_s": round(new / wall, 1), "first_run_s": round(first, 2)}


def static_generate(args) -> dict:
    """`generate` on a static cache (transformers compiles its step on CUDA) in a child process,
    stopped, and the step skipped, past --compile-limit-s: a slow compile must not eat the loan."""
    limit = min(args.compile_limit_s, args.deadline - time.perf_counter())
    command = [sys.executable, "-m", "hetspec.benchmarks.gpu_profile", "--static-generate", "--device", args.device,
               "--target", args.target, "--dtype", args.dtype, "--context", str(args.context),
               "--tokens", str(args.tokens), "--prompts", str(args.prompts)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)     # its own group: compile workers are stopped with it
    try:
        stdout, stderr = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"skipped": f"over {limit:.0f} s, loading and compiling: not measured"}
    if child.returncode:
        return {"failed": (stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]}
    return json.loads(stdout.strip().splitlines()[-1])


def through_engine(args, ids: list[list[int]], passes: str) -> dict:
    """The engine with its target's passes `passes`, the draft on a CPU core: per mode, tokens/s and a
    speculative round's draft, verify, wall and overhead ms (forced speculation drafts GAMMA tokens
    a round, however few are accepted)."""
    import hetspec

    config = {"target": {"backend": "transformers", "model": args.target, "device": args.device,
                         "dtype": args.dtype, "passes": passes},
              "draft": {"backend": "torch", "model": args.draft}, "server": {"max_context": 1024}}
    start = time.perf_counter()
    with hetspec.launch(config) as engine:
        info = engine.get_info()
        doc = {"kernels": info["target"]["kernels"], "load_s": info["target"]["load_s"],
               "start_up_s": round(time.perf_counter() - start, 2), "caches": info["config"]["server"]["max_running"],
               "draft_cores": info["draft"]["cores"],
               "verify_ms": {k: round(1e3 * v, 2) for k, v in info["budget"].get("verify_s", {}).items()}}
        for mode, speculation in MODES:
            fixed = {} if mode == "target" else {"gamma": GAMMA}
            engine.generate(ids[0], max_new_tokens=8, mode=mode, speculation=speculation, **fixed)   # warm-up
            totals = Counter()
            for prompt in ids:
                start = time.perf_counter()
                stats = engine.generate(prompt, max_new_tokens=args.tokens, mode=mode, speculation=speculation,
                                        cache_prompt=False, **fixed).stats
                totals.update({"wall": time.perf_counter() - start, **{key: stats[key] for key in COUNTED}})
            spec = max(1, totals["spec_rounds"])
            doc[mode] = {"tokens_per_s": round(totals["new_tokens"] / totals["wall"], 1),
                         **{key: totals[key] for key in COUNTED[:4]},
                         "ms_per_spec_round": {k: round(1e3 * totals[f"{k}_s"] / spec, 2)
                                               for k in ("draft", "verify", "round", "overhead")}}
    return doc


def prompts(args) -> list[list[int]]:
    """`--prompts` random prompts of `--context` ids (one length: one static cache shape for generate)."""
    import numpy as np

    from hetspec.models import resolve_model

    vocab = (resolve_model(args.target).random or {}).get("vocab", 32000)     # a random model's, else Llama's
    return np.random.default_rng(0).integers(0, vocab, (args.prompts, args.context)).tolist()


def report(doc: dict) -> str:
    """The JSON's main numbers as markdown."""
    lines = [f"# gpu_profile on {doc['device_name']}", "", (f"Target `{doc['target']}` in {doc['dtype']}, draft "
             f"`{doc['draft']}`; windows after {doc['context']} tokens; {doc['elapsed_s']} s."), "",
             "| passes | " + " | ".join(f"{n}: wall / kernel ms" for n in SIZES) + " | prompt ms |",
             "|---" * (len(SIZES) + 2) + "|"]
    lines += [f"| {passes} | " + " | ".join(f"{c[str(n)]['wall_ms'][0]} / {c[str(n)]['kernel_ms']}" for n in SIZES)
              + f" | {c['prompt_ms'][0]} |" for passes, c in doc["curve"].items()]
    if doc["by_context"]:
        lines += ["", "| positions held x window | span | wall / kernel ms | wall per kernel |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['span']} | {v['wall_ms'][0]} / {v['kernel_ms']} | {v['wall_per_kernel']} |"
                  for k, v in doc["by_context"].items() if k != "spans"]
    if doc["batch"]:
        head = f"| requests x {doc['batch']['window']} tokens | packed pass ms | captured replays ms | captured batch pass ms |"
        lines += ["", head, "|---|---|---|---|"]
        lines += [f"| {b} | {v['packed_ms'][0]} | {v['replays_ms'][0]} | {v['captured_batch_ms'][0]} |"
                  for b, v in doc["batch"].items() if b != "window"]
    lines += ["", "| engine passes | mode | tok/s | ms a spec round: draft / verify / round / overhead |",
              "|---|---|---|---|"]
    lines += [f"| {passes} | {mode} | {e[mode]['tokens_per_s']} | "
              + " / ".join(map(str, e[mode]["ms_per_spec_round"].values())) + " |"
              for passes, e in doc["engine"].items() for mode, _ in MODES]
    lines += [f"\nengine {passes}: started in {e['start_up_s']} s (target loaded in {round(e['load_s'], 2)} s), "
              f"{e['caches']} caches; kernels: {e['kernels']}" for passes, e in doc["engine"].items()]
    lines += ["", f"generate: `{json.dumps(doc['generate'])}`", "", f"paced_profile: `{json.dumps(doc['paced_profile'])}`",
              "", f"skipped: {', '.join(doc['skipped']) or 'nothing'}", ""]
    return "\n".join(lines)


NAMES = ("target", "draft", "dtype", "context", "tokens", "prompts", "repeats")   # SHAPES' fields
STEPS = {"curve", "context", "engine", "batch", "generate"}


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.gpu_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    for name, value in zip(NAMES, SHAPES["cuda"]):
        p.add_argument(f"--{name}", type=type(value), help="default: the device's (SHAPES)")
    p.add_argument("--steps", default="curve,context,engine,batch,generate",
                   help="which of curve, context, engine, batch, generate (default: all)")
    p.add_argument("--budget-s", type=float, default=300, help="no step starts after this many seconds")
    p.add_argument("--compile-limit-s", type=float, default=90, help="static-cache generate's limit, compiling included")
    p.add_argument("--out", help="write the JSON here (and print its summary, not the JSON)")
    p.add_argument("--report", help="write the summary (markdown) here")
    p.add_argument("--static-generate", action="store_true", help=argparse.SUPPRESS)   # static_generate's child
    args = p.parse_args(argv)
    for name, value in zip(NAMES, SHAPES[args.device]):
        setattr(args, name, getattr(args, name) or value)
    args.steps = set(args.steps.split(","))
    if not args.steps <= STEPS:
        p.error(f"--steps: unknown {', '.join(sorted(args.steps - STEPS))} (steps: {', '.join(sorted(STEPS))})")
    if args.context < SIZES[-1]:
        p.error(f"--context must be at least {SIZES[-1]} (a prompt pass longer than the largest window)")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.static_generate:
        print(json.dumps({**generate(load(args), prompts(args), args.tokens, args.device, cache_implementation="static"),
                          "compiled": args.device == "cuda"}))   # transformers compiles a static step on CUDA only
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_profile: no CUDA GPU (--device cpu rehearses with small shapes)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    args.deadline = start + args.budget_s
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    import transformers

    doc = {"device_name": name, "torch": torch.__version__, "transformers": transformers.__version__,
           **{k: getattr(args, k) for k in NAMES}, "gamma": GAMMA,
           "curve": {}, "by_context": {}, "engine": {}, "batch": {}, "generate": {}, "paced_profile": None, "skipped": []}
    ids = prompts(args)
    if args.steps & {"curve", "context"}:
        curves(args, ids, doc)
    if "captured" in doc["curve"]:
        doc["paced_profile"] = paced_profile(doc["curve"]["captured"], args.context,
                                             re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + "-captured",
                                             f"{name}, {args.target} in {args.dtype}, {time.strftime('%Y-%m-%d')}")
    for passes in ("captured", "eager"):
        if due(args, doc, f"engine {passes}"):
            doc["engine"][passes] = through_engine(args, ids, passes)
            save(args, doc)
    after_engine(args, ids, doc)
    if due(args, doc, "generate static"):
        doc["generate"]["static"] = static_generate(args)
    doc["elapsed_s"] = round(time.perf_counter() - start, 1)
    save(args, doc)
    print(report(doc) if args.out else json.dumps(doc, indent=1))
    if args.report:
        Path(args.report).write_text(report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
