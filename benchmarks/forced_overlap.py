"""What DuoDecoding's overlap gains over SpS when every round speculates, beside the target alone.

    python -m hetspec.benchmarks.forced_overlap [--config gemma3-smollm2] [--categories code continuation]
                                                [--limit 4] [--max-new-tokens 64] [--repeats 2]

hetspec-bench runs each mode as a user's request does (`speculation="auto"`), so where
drafting does not pay the gate rests and DuoDecoding, SpS and the target alone run
alike. This forces speculation (`speculation="always"`) on one engine, taking the three
modes in turn on each prompt (the order reversed every other repeat, so drift falls
on all three alike): the mode ratio the pipeline gives where it drafts, and what
drafting costs against the target alone on every core. Every greedy output must equal
the target alone's; the script exits 1 if one does not.
"""
from __future__ import annotations

import argparse
import time

import hetspec
from hetspec.benchmarks.data import ALL_CATEGORIES, load_prompts

MODES = ("duodec", "sequential", "target")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.forced_overlap",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="gemma3-smollm2")
    parser.add_argument("--categories", nargs="+", default=["code", "continuation"],
                        choices=ALL_CATEGORIES)
    parser.add_argument("--limit", type=int, default=4, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    prompts = load_prompts(args.categories, args.limit, args.max_new_tokens)
    totals = {mode: [0, 0.0, 0, 0, 0] for mode in MODES}    # tokens, seconds, spec rounds, accepted, drafted
    mismatches = 0
    with hetspec.launch(args.config) as engine:
        engine.generate(prompts[0].text, max_new_tokens=8, mode="duodec", speculation="always")   # warm-up
        info = engine.get_info()
        for repeat in range(args.repeats):
            for prompt in prompts:
                outputs = {}
                for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                    start = time.perf_counter()
                    forced = {} if mode == "target" else {"speculation": "always"}
                    result = engine.generate(prompt.text, max_new_tokens=prompt.max_new_tokens, mode=mode, **forced)
                    cell, stats = totals[mode], result.stats
                    cell[0] += len(result.token_ids)
                    cell[1] += time.perf_counter() - start
                    cell[2] += stats["spec_rounds"]
                    cell[3] += stats["accepted"]
                    cell[4] += stats["drafted"]
                    outputs[mode] = result.token_ids
                mismatches += sum(outputs[m] != outputs["target"] for m in MODES)
    print(f"{args.config}: target {info['target']['backend']} on cores {info['target']['cores']}, draft "
          f"{info['draft']['backend']} on {info['draft']['cores']}; {len(prompts)} prompts x {args.repeats}, "
          f"speculation forced")
    rate = {mode: cell[0] / cell[1] for mode, cell in totals.items()}
    for mode, (tokens, _, rounds, accepted, drafted) in totals.items():
        held = f", {accepted}/{drafted} drafted tokens held" if drafted else ""
        print(f"  {mode:10s} {rate[mode]:6.1f} tok/s ({tokens} tokens, {rounds} speculative rounds{held})")
    print(f"  DuoDecoding over SpS {rate['duodec'] / rate['sequential']:.2f}x; over the target alone "
          f"{rate['duodec'] / rate['target']:.2f}x; greedy outputs unlike the target alone's: {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
