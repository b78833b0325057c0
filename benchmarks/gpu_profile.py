"""A target on a GPU, measured (benchmarks/README.md, "On a GPU"): a pass's wall and kernel time by
window size, eager, on a static cache and captured (CUDA graphs); the engine's rounds with a CPU
draft; `generate`; and a paced profile (hetspec.core.gpu_profiles) from the captured curve. The models
are random, as a lent machine fetches no weights; `--device cpu` rehearses at tiny shapes."""
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

import numpy as np
import torch
import transformers
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import hetspec
from hetspec.benchmarks.bench.tables import table
from hetspec.models import resolve_model
from hetspec.workers.common.hf_loading import load_causal_lm
from hetspec.workers.common.kv_model import KVModel, StaticKVModel
from hetspec.workers.target.attention import use_grouped_attention
from hetspec.workers.target.captured import CapturedKVModel

SHAPES = {   # device: target, draft, dtype, context, tokens, prompts, repeats
    "cuda": ("random:vocab=152064,hidden=3584,layers=28,heads=28,kv_heads=4,intermediate=18944,seed=0,init=device",
             "random:vocab=152064,hidden=768,layers=2,heads=12,intermediate=3072,seed=1", "bfloat16", 256, 64, 3, 10),
    "cpu": ("random:vocab=320,hidden=64,layers=2,heads=4,kv_heads=2,seed=0",
            "random:vocab=320,hidden=64,layers=1,heads=4,seed=1", "float32", 32, 12, 2, 3),
}
NAMES = ("target", "draft", "dtype", "context", "tokens", "prompts", "repeats")   # SHAPES' fields
STEPS = {"curve", "engine", "generate"}
SIZES = (1, 2, 4, 8, 16, 32)     # the windows timed after the context (the engine pads to these)
FLAT = 1.10                      # a size costs "the same" as one token within 10%
GAMMA = 4                        # the forced speculative rounds' window
MODES = [("target", "auto"), ("duodec", "always")]
COUNTED = ("rounds", "spec_rounds", "drafted", "accepted", "new_tokens", "draft_s", "verify_s", "round_s", "overhead_s")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def wall_ms(run, device: str, repeats: int) -> list[float]:
    """[median, fastest] ms of `run`, each synchronised: what the host waits for a pass."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        times.append(1e3 * (time.perf_counter() - start))
    return [round(float(np.median(times)), 3), round(min(times), 3)]


def kernel_ms(run, device: str) -> float:
    """ms of GPU kernels (on a CPU: of ops) in one run, self times summed as torch.profiler's table totals
    them: the time the device itself computed, launches and Python aside."""
    gpu = device == "cuda"
    sync(device)
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as prof:
        run()
        sync(device)
    kind = DeviceType.CUDA if gpu else DeviceType.CPU
    return round(sum(e.self_device_time_total if gpu else e.self_cpu_time_total
                     for e in prof.events() if e.device_type == kind and not e.is_user_annotation) / 1e3, 3)


def curve(kv, args, context: list[int], eager: dict | None = None) -> dict:
    """Per window size after `context`, wall_ms and kernel_ms after two warm-up passes (cuBLAS's choices, a captured
    size's recording), and their ratio; and the prompt pass's wall ms. Where the profiler sees no kernels (a CUDA
    graph's replay on some versions), the eager pass's of the same size stand in, and kernel_source says so."""
    kv.use(0)
    prompt = lambda: kv.forward(context, 0, all_logits=False)
    prompt()                             # warm-up (and a static cache's allocation)
    out = {"prompt_ms": wall_ms(prompt, args.device, 3)}
    for n in SIZES:
        window = lambda n=n: kv.forward(list(range(1, n + 1)), len(context), all_logits=True)
        window(), window()
        wall, kernels, source = wall_ms(window, args.device, args.repeats), kernel_ms(window, args.device), "profiled"
        if kernels == 0:
            kernels = eager[str(n)]["kernel_ms"] if eager else None
            source = ("the eager pass's" if eager else "none:") + " the profiler saw no kernels"
        out[str(n)] = {"wall_ms": wall, "kernel_ms": kernels, "kernel_source": source,
                       "wall_per_kernel": round(wall[0] / kernels, 2) if kernels else None}
    return out


def paced_profile(captured: dict, context: int, name: str, where: str) -> dict:
    """A GpuProfile's fields from the captured curve. A pass can be padded to a longer one, so a size costs at most
    what any longer one does (that evens out noise); flat_to is the largest size within FLAT of one token's cost,
    window_ms their mean, per_token_ms the least-squares slope past it (no size past it: the prompt's cost a
    token), prefill_ms_per_token the prompt pass's beyond window_ms."""
    ms = {n: min(captured[str(m)]["wall_ms"][0] for m in SIZES if m >= n) for n in SIZES}
    flat = [n for n in SIZES if ms[n] <= FLAT * ms[1]]
    window = sum(ms[n] for n in flat) / len(flat)
    prefill = max(0.0, (captured["prompt_ms"][0] - window) / context)
    past = [n - flat[-1] for n in SIZES if n > flat[-1]]
    slope = sum((ms[n + flat[-1]] - window) * n for n in past) / sum(n * n for n in past) if past else prefill
    return {"name": name, "window_ms": round(window, 3), "flat_to": flat[-1], "per_token_ms": round(max(0.0, slope), 4),
            "prefill_ms_per_token": round(prefill, 4),
            "source": (f"measured: benchmarks/gpu_profile.py, captured passes after {context} tokens, {where}; "
                       f"flat within {round(100 * (FLAT - 1))}% to {flat[-1]} tokens, per token beyond: "
                       + ("the slope past it" if past else "the prompt's (no size past it)"))}


def load(args, grouped: bool = True):
    """The target as the worker loads it: its dtype, and grouped-query attention unrepeated."""
    lm = load_causal_lm(resolve_model(args.target), args.dtype, args.device)
    if grouped:
        use_grouped_attention(lm)
    return lm


def due(args, doc: dict, what: str) -> bool:
    """Whether step `what` runs: chosen (--steps) and starting within the budget (else named as skipped)."""
    chosen, in_time = what.split()[0] in args.steps, time.perf_counter() < args.deadline
    if chosen and not in_time:
        doc["skipped"].append(what)
    return chosen and in_time


def save(args, doc: dict) -> None:
    """The JSON as it stands (after each step: a crash in the next loses only that one)."""
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))


def in_process(args, ids: list[list[int]], doc: dict, step: str) -> None:
    """`step` on the target in this process: the pass curves (captured, eager, static), or eager `generate`."""
    lm = load(args)
    kinds = [("captured", CapturedKVModel), ("eager", KVModel), ("static", StaticKVModel)] if step == "curve" else []
    for passes, kind in kinds:
        if due(args, doc, f"curve {passes}"):
            kv = kind(lm, args.device, *([] if kind is KVModel else [args.context + 2 * SIZES[-1], SIZES[-1]]))
            doc["curve"][passes] = curve(kv, args, ids[0], doc["curve"].get("eager"))
            if passes == "captured":
                doc["curve"][passes]["graphs"] = kv.fallback or ("CUDA graphs" if kv.graphs else "run eagerly (no CUDA)")
            del kv
            save(args, doc)
    if step == "generate" and due(args, doc, "generate eager"):
        doc["generate"]["eager"] = generate(lm, ids, args.tokens, args.device)
        save(args, doc)
    lm = None                     # freed, and the GPU's cache emptied, before the engine loads its own
    if args.device == "cuda":
        torch.cuda.empty_cache()


def generate(lm, ids: list[list[int]], tokens: int, device: str, **how) -> dict:
    """Greedy `generate`'s tokens/s after a warm-up run (where a static cache's step compiles), and that run's s."""
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
    """`generate` on a static cache (compiled on CUDA) in a child stopped past --compile-limit-s: not the loan's end."""
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
    """The engine, its target's passes `passes`, the draft on a CPU core: per mode, tok/s and a speculative round."""
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
            how = {"mode": mode, "speculation": speculation, **({} if mode == "target" else {"gamma": GAMMA})}
            engine.generate(ids[0], max_new_tokens=8, **how)   # warm-up
            totals = Counter()
            for prompt in ids:
                start = time.perf_counter()
                stats = engine.generate(prompt, max_new_tokens=args.tokens, cache_prompt=False, **how).stats
                totals.update({"wall": time.perf_counter() - start, **{key: stats[key] for key in COUNTED}})
            doc[mode] = {"tokens_per_s": round(totals["new_tokens"] / totals["wall"], 1),
                         **{key: totals[key] for key in COUNTED[:4]},
                         "ms_per_spec_round": {k: round(1e3 * totals[f"{k}_s"] / max(1, totals["spec_rounds"]), 2)
                                               for k in ("draft", "verify", "round", "overhead")}}
    return doc


def report(doc: dict) -> str:
    """The JSON's main numbers as markdown."""
    lines = [f"# gpu_profile on {doc['device_name']}", "", (f"Target `{doc['target']}` in {doc['dtype']}, draft "
             f"`{doc['draft']}`; windows after {doc['context']} tokens; {doc['elapsed_s']} s."), "",
             *table(["passes", *[f"{n}: wall / kernel ms" for n in SIZES], "prompt ms"],
                    [[passes, *[f"{c[str(n)]['wall_ms'][0]} / {c[str(n)]['kernel_ms']}" for n in SIZES],
                      str(c["prompt_ms"][0])] for passes, c in doc["curve"].items()])]
    lines += ["", *table(["engine passes", "mode", "tok/s", "ms a spec round: draft / verify / round / overhead"],
                         [[passes, mode, str(e[mode]["tokens_per_s"]), " / ".join(map(str, e[mode]["ms_per_spec_round"]
                                                                                      .values()))]
                          for passes, e in doc["engine"].items() for mode, _ in MODES])]
    lines += [f"\nengine {passes}: started in {e['start_up_s']} s (target loaded in {round(e['load_s'], 2)} s), "
              f"{e['caches']} caches; kernels: {e['kernels']}" for passes, e in doc["engine"].items()]
    return "\n".join([*lines, "", f"generate: `{json.dumps(doc['generate'])}`", "",
                      f"paced_profile: `{json.dumps(doc['paced_profile'])}`", "",
                      f"skipped: {', '.join(doc['skipped']) or 'nothing'}", ""])


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.gpu_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    for name, value in zip(NAMES, SHAPES["cuda"]):
        p.add_argument(f"--{name}", type=type(value), help="default: the device's (SHAPES)")
    p.add_argument("--steps", default="curve,engine,generate", help="which of curve, engine, generate (default: all)")
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


def prompts(args) -> list[list[int]]:
    """`--prompts` random prompts of `--context` ids (one length: one static cache shape for generate)."""
    vocab = (resolve_model(args.target).random or {}).get("vocab", 32000)     # a random model's, else Llama's
    return np.random.default_rng(0).integers(0, vocab, (args.prompts, args.context)).tolist()


def main(argv=None) -> int:
    args = parse(argv)
    if args.static_generate:       # transformers compiles a static step on CUDA only
        print(json.dumps({**generate(load(args, grouped=False), prompts(args), args.tokens, args.device,
                                     cache_implementation="static"), "compiled": args.device == "cuda"}))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_profile: no CUDA GPU (--device cpu rehearses with small shapes)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    args.deadline = start + args.budget_s
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    doc = {"device_name": name, "torch": torch.__version__, "transformers": transformers.__version__,
           **{k: getattr(args, k) for k in NAMES}, "gamma": GAMMA, "curve": {}, "engine": {},
           "generate": {}, "paced_profile": None, "skipped": []}
    ids = prompts(args)
    if "curve" in args.steps:
        in_process(args, ids, doc, "curve")
    if "captured" in doc["curve"]:
        doc["paced_profile"] = paced_profile(doc["curve"]["captured"], args.context,
                                             re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + "-captured",
                                             f"{name}, {args.target} in {args.dtype}, {time.strftime('%Y-%m-%d')}")
    for passes in ("captured", "eager"):
        if due(args, doc, f"engine {passes}"):
            doc["engine"][passes] = through_engine(args, ids, passes)
            save(args, doc)
    if "generate" in args.steps:
        in_process(args, ids, doc, "generate")
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
