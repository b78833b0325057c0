"""Is the llama.cpp target faithful to the file? Its logits against llama.cpp's defaults.

For each shipped GGUF file and held prompt, llama.cpp with its default settings (what
a user runs) decodes N greedy tokens one at a time; each model in FORCED is then
teacher-forced along those tokens. Reported: how often its argmax is llama.cpp's
token (top-1 agreement), and how far its logits are from llama.cpp's. The models: the
engine's two batch-invariant GGUF targets (workers/target/llama_target.py and
native_target.py), the continuation as one window, as a verify pass would; and llama.cpp
itself, run as the reference was but with weight repacking off, or with flash attention
off. Two of llama.cpp's own settings differ by that much: a noise floor the target
cannot be expected to beat. llama.cpp reads the prompt twice
over: in one batch, as it does by default, and one token a pass, which leaves out its
own batch dependence (its batched prefill computes another cache). Every run has a
process of its own, since ggml reads its tiled-product switch once per process and the
target switches it off at import.

    python -m hetspec.benchmarks.llama_fidelity --out benchmarks/reports/llama-fidelity
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

from hetspec.benchmarks.data import ALL_CATEGORIES, load_prompts
from hetspec.benchmarks.machine import describe_machine
from hetspec.models import resolve_model

FILES = {"SmolLM2-135M-Instruct Q4_1": "builtin:smollm2", "Gemma 3 270M Q4_K_M": "builtin:gemma3-270m"}


def read_prompt(s, prompt: list[int], batched: bool) -> np.ndarray:
    """A llama.cpp Session's logits after the prompt, read in one batch or one token a pass."""
    if batched:
        return s.decode(prompt, 0, last_only=True)[0]
    return [s.decode([t], i, last_only=True)[0] for i, t in enumerate(prompt)][-1]


def reference(path: str, prompts: list[str], steps: int, scratch: str, batched_prompt: bool) -> list[dict]:
    """llama.cpp's defaults: each prompt's greedy tokens, its logits saved beside them."""
    from hetspec.benchmarks.llama_invariance import Session

    s = Session(path, -1, True, 1)
    out = []
    try:
        for i, text in enumerate(prompts):
            prompt = s.tokenize(text)[-400:]
            rows = [read_prompt(s, prompt, batched_prompt)]
            tokens = []
            for step in range(steps):
                tokens.append(int(np.argmax(rows[-1])))
                rows.append(s.decode(tokens[-1:], len(prompt) + step)[0])
            file = os.path.join(scratch, f"{i}.npy")
            np.save(file, np.stack(rows[:-1]))         # row j: the logits that chose tokens[j]
            out.append({"prompt": prompt, "tokens": tokens, "logits": file})
    finally:
        s.close()
    return out


def engine_target(path: str, kind: str = "llama.cpp"):
    """One of the engine's batch-invariant targets: the continuation as one window, as a verify pass."""
    from hetspec.workers.target.llama_target import LlamaTarget
    from hetspec.workers.target.native_target import NativeTarget

    model = (LlamaTarget if kind == "llama.cpp" else NativeTarget)(path, n_ctx=1024, caches=1, threads=1)

    def force(prompt: list[int], tokens: list[int], batched_prompt: bool) -> np.ndarray:
        model.forward(0, prompt[:-1], 0, 1)           # batch-invariant: how the prompt is read is moot
        return model.forward(0, [prompt[-1], *tokens[:-1]], len(prompt) - 1, len(tokens))
    return force, model.close


def llama_cpp_session(path: str, flash: int, repack: bool):
    """llama.cpp in another setting, run as the reference was (prompt read the same way, then one
    token a pass) but along its tokens: what that setting alone changes, a noise floor."""
    from hetspec.benchmarks.llama_invariance import Session

    s = Session(path, flash, repack, 1)

    def force(prompt: list[int], tokens: list[int], batched_prompt: bool) -> np.ndarray:
        rows = [read_prompt(s, prompt, batched_prompt)]
        return np.stack(rows + [s.decode([t], len(prompt) + i)[0] for i, t in enumerate(tokens[:-1])])
    return force, s.close


# What is teacher-forced: name -> opener(path) giving (force(prompt, tokens, batched_prompt) -> each
# token's logits row, close). A future target is one more opener here.
FORCED = {"llama.cpp target": engine_target, "native target": partial(engine_target, kind="native"),
          "llama.cpp, repacking off": partial(llama_cpp_session, flash=-1, repack=False),
          "llama.cpp, flash attention off": partial(llama_cpp_session, flash=0, repack=True)}


def compare(opener, path: str, runs: list[dict], batched_prompt: bool) -> list[dict]:
    """One model teacher-forced along llama.cpp's tokens, each row against llama.cpp's logits."""
    force, close = opener(path)
    out = []
    try:
        for run in runs:
            tokens, want = run["tokens"], np.load(run["logits"])
            got = force(run["prompt"], tokens, batched_prompt)
            diff = np.abs(got - want)
            out.append({"positions": len(tokens), "agree": int((got.argmax(1) == np.array(tokens)).sum()),
                        "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())})
    finally:
        close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("llama-fidelity"))
    parser.add_argument("--limit", type=int, default=3, help="prompts per category")
    parser.add_argument("--steps", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--file", choices=sorted(FILES.values()), help="one file only (default: both)")
    parser.add_argument("--forced", choices=sorted(FORCED), action="append",
                        help="teacher-force this model only (repeatable; default: all)")
    args = parser.parse_args()
    prompts = [p.text for p in load_prompts(ALL_CATEGORIES, args.limit)]
    results = {"command": "python -m hetspec.benchmarks.llama_fidelity", "prompts": len(prompts),
               "steps": args.steps, "machine": describe_machine(), "files": {}}
    spawn = multiprocessing.get_context("spawn")
    for name, builtin in FILES.items():
        if args.file and builtin != args.file:
            continue
        path = resolve_model(builtin).file
        for batched in (True, False):
            with tempfile.TemporaryDirectory() as scratch:
                with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                    runs = pool.submit(reference, path, prompts, args.steps, scratch, batched).result()
                for model, opener in FORCED.items():
                    if args.forced and model not in args.forced:
                        continue
                    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                        rows = pool.submit(compare, opener, path, runs, batched).result()
                    positions, agree = sum(r["positions"] for r in rows), sum(r["agree"] for r in rows)
                    key = f"{name}, llama.cpp prompt {'in one batch' if batched else 'one token a pass'}, {model}"
                    results["files"][key] = {
                        "positions": positions, "top1_agreement": agree / positions,
                        "max_abs_diff": max(r["max_abs_diff"] for r in rows),
                        "mean_abs_diff": float(np.mean([r["mean_abs_diff"] for r in rows])), "per_prompt": rows}
                    print(key, results["files"][key]["top1_agreement"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "report.md").write_text(report(results))
    print(report(results))


def report(results: dict) -> str:
    lines = ["# Are the GGUF targets faithful to the file?", "",
             (f"`{results['command']}`: {results['prompts']} prompts (three of each Spec-Bench category and of "
              f"hetspec's code and continuation prompts, plain text, the last 400 tokens), {results['steps']} "
              f"greedy tokens each by llama.cpp with its defaults, one token a pass; then teacher-forced along "
              f"them: the engine's two batch-invariant GGUF targets in one window (*llama.cpp target*, *native "
              f"target*), and llama.cpp run as the reference was but with weight repacking off (*llama.cpp, "
              f"repacking off*) or flash attention off (*llama.cpp, flash attention off*). Those last rows are "
              f"llama.cpp's own noise floor: two of its settings differ by that much, so no target can be expected "
              f"to agree better. 1 thread, {results['machine']['cpu']}, git {results['machine']['git_commit']}."),
             "",
             ("| file, how llama.cpp read the prompt, what was teacher-forced | positions | top-1 agreement | "
              "largest logit difference | mean logit difference |"),
             "|---|---|---|---|---|"]
    for name, r in results["files"].items():
        lines.append(f"| {name} | {r['positions']} | {100 * r['top1_agreement']:.2f}% | {r['max_abs_diff']:.3g} | "
                     f"{r['mean_abs_diff']:.3g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
