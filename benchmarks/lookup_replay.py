"""What prompt lookup gains over the target alone, replayed on the target's own greedy text.

    python -m hetspec.benchmarks.lookup_replay [--config gemma3-smollm2] [--limit 4] [--max-new-tokens 128]

Mode `target` never guesses; its tokens are replayed through a rest's own guessing rule
(PromptLookup sized by Windows.lookup), each pass costed at its window's measured time on
the native target plus --overhead-ms. Per category: the target alone's time over lookup's,
and how often guesses held, by match length. The config's target must be a GGUF file.
"""
from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

import numpy as np

import hetspec
from hetspec.benchmarks.bench.data import ALL_CATEGORIES, load_prompts
from hetspec.config import load_config
from hetspec.core.pinning import pin
from hetspec.models import resolve_model
from hetspec.scheduler.decoding.budget import CostModel, Windows
from hetspec.scheduler.decoding.lookup import PromptLookup
from hetspec.scheduler.tokenizer import Tokenizer
from hetspec.workers.common.thread_pinning import pin_threads
from hetspec.workers.target.native_target import NativeTarget

CONTEXT, REPEATS = 256, 5


def greedy_texts(config: str, categories, limit: int, max_new_tokens: int) -> list[tuple[str, list, list]]:
    """(category, prompt ids, the target's greedy ids) for each prompt, from the engine in mode target."""
    tokenizer = Tokenizer(resolve_model(load_config(config).target.model))
    texts = []
    with hetspec.launch(config) as engine:
        for prompt in load_prompts(categories, limit=limit):
            result = engine.generate(prompt.text, max_new_tokens=max_new_tokens, mode="target")
            texts.append((prompt.category, tokenizer.encode_prompt(prompt.text), result.token_ids))
    return texts


def window_seconds(path: str, threads: int, largest: int) -> dict[int, float]:
    """The native target's verify pass of 1..largest tokens, fastest of REPEATS."""
    target = NativeTarget(path, 1024, 1, threads)
    before = sorted(os.sched_getaffinity(0))
    if threads > 1:            # each compute thread on a core of its own, as the engine pins them
        pin_threads(before[:threads], threads, target.thread_ids)
    try:
        rng = np.random.default_rng(0)
        target.forward(0, rng.integers(10, 5000, CONTEXT), 0, 1)
        best = {}
        for _ in range(REPEATS):
            for n in range(1, largest + 1):
                start = time.perf_counter()
                target.forward(0, rng.integers(10, 5000, n), CONTEXT, n)
                best[n] = min(best.get(n, float("inf")), time.perf_counter() - start)
        return best
    finally:
        target.close()
        pin(before)            # the caller's threads as they were (a test calls this in pytest's process)


def replay(prompt: list, out: list, windows: Windows, pass_s) -> tuple[float, dict]:
    """Seconds lookup's passes take for `out` after `prompt` (its first token came from
    the prefill), and per match length [guessed, kept] tokens."""
    full, lookup = np.asarray(prompt + out, np.int32), PromptLookup()
    position, seconds, held = len(prompt) + 1, 0.0, defaultdict(lambda: [0, 0])
    while position < len(full):
        room = len(full) - position - 1
        guess = lookup.guess(full[:position], lambda hit_rate, room=room: windows.lookup(hit_rate, room))
        kept = 0
        while kept < len(guess) and guess[kept] == full[position + kept]:
            kept += 1
        if len(guess):
            lookup.verified(len(guess), kept)
            held[lookup.matched][0] += len(guess)
            held[lookup.matched][1] += kept
        seconds += pass_s(len(guess) + 1)
        position += kept + 1
    return seconds, held


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.lookup_replay",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="gemma3-smollm2")
    parser.add_argument("--categories", nargs="+", default=list(ALL_CATEGORIES))
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="the target's threads, as in a rest (default 2)")
    parser.add_argument("--overhead-ms", type=float, default=1.5, help="the scheduler's share of a pass")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    model = resolve_model(config.target.model)
    if not model.gguf_file:
        raise SystemExit(f"{args.config}: its target is not a GGUF file; the replay times the native target")
    texts = greedy_texts(args.config, args.categories, args.limit, args.max_new_tokens)
    measured = window_seconds(model.file, args.threads, config.decoding.lookup + 1)
    windows = Windows(1, False, config.decoding.max_gamma, CostModel(1.0, measured), config.decoding.lookup)
    pass_s = lambda n: measured[n] + args.overhead_ms / 1e3
    print(f"{args.config}, {args.threads} thread(s): a pass of n tokens, ms: "
          + ", ".join(f"{n}: {s * 1e3:.1f}" for n, s in measured.items()))
    print("category: lookup's gain over the target alone; guessed tokens that held, by match length")
    by_category = defaultdict(lambda: [0.0, 0.0, defaultdict(lambda: [0, 0])])
    for category, prompt, out in texts:
        seconds, held = replay(prompt, out, windows, pass_s)
        cell = by_category[category]
        cell[0] += seconds
        cell[1] += (len(out) - 1) * pass_s(1)
        for n, counts in held.items():
            cell[2][n] = [a + b for a, b in zip(cell[2][n], counts)]
    for category, (seconds, alone, held) in by_category.items():
        if not seconds:
            print(f"  {category}: no token after the first to replay")
            continue
        rates = ", ".join(f"n={n} {kept}/{guessed}" for n, (guessed, kept) in sorted(held.items(), reverse=True))
        print(f"  {category}: {alone / seconds:.2f}x; {rates}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
