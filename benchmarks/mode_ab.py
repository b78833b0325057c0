"""Modes taking turns on one engine: each prompt runs in every mode before the next
prompt, so a machine that drifts within the hour drifts for all of them alike.
Prints each request's decode tok/s after its first token and what the engine did
(speculative rounds, rests, lookup, the fallback's reason), then each mode's pooled
decode tok/s and its ratio to the first mode's. Greedy outputs must agree.

    python -m hetspec.benchmarks.mode_ab --config qwen2.5-coder --modes target duodec sequential \\
        --categories stubs --limit 4 --max-new-tokens 96
"""
from __future__ import annotations

import argparse
import sys
import time

from hetspec.benchmarks.data import ALL_CATEGORIES, load_prompts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.mode_ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="smollm2", help="a shipped config's name or a TOML path")
    parser.add_argument("--modes", nargs="+", default=["target", "duodec"], help="the first is the reference")
    parser.add_argument("--categories", nargs="+", default=["code"], choices=ALL_CATEGORIES)
    parser.add_argument("--limit", type=int, default=4, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--speculation", default="auto", choices=["auto", "always"],
                        help="always: the speculative modes speculate every round (their rounds' profile)")
    args = parser.parse_args(argv)
    import hetspec

    started = time.perf_counter()
    with hetspec.launch(args.config) as engine:
        print(f"started in {time.perf_counter() - started:.1f} s; gamma {engine.get_info()['gamma']}")
        prompts = load_prompts(args.categories, args.limit)
        engine.generate(prompts[0].text, max_new_tokens=8, mode="target")       # warm: the kernels, the caches
        pooled = {mode: [0, 0.0] for mode in args.modes}
        differ = 0
        for prompt in prompts:
            outputs = set()
            for mode in args.modes:
                forced = {} if mode == "target" else {"speculation": args.speculation}
                result = engine.generate(prompt.text, max_new_tokens=args.max_new_tokens, mode=mode, **forced)
                stats = result.stats
                outputs.add(tuple(result.token_ids))
                tokens, seconds = stats["new_tokens"] - 1, stats["total_s"] - stats["ttft_s"]
                pooled[mode][0] += tokens
                pooled[mode][1] += seconds
                print(f"{prompt.key:16} {mode:10} {tokens / seconds:7.2f} tok/s  {_did(stats)}", flush=True)
            differ += len(outputs) > 1
        reference = pooled[args.modes[0]][0] / pooled[args.modes[0]][1]
        for mode, (tokens, seconds) in pooled.items():
            print(f"{mode:10} {tokens / seconds:7.2f} tok/s  {tokens / seconds / reference:.2f}x {args.modes[0]}")
        print(f"prompts whose greedy outputs differ between modes: {differ}")
    return 1 if differ else 0


def _did(stats: dict) -> str:
    said = (f"spec rounds {stats['spec_rounds']}, acceptance {stats['acceptance_rate']:.2f}, rested {stats['rested']}, "
            f"lookup {stats['lookup_accepted']}/{stats['lookup_guessed']}")
    if stats["spec_rounds"]:          # where the rounds' time went: drafting, verifying, neither (the scheduler, idle)
        committed = round(stats["mean_accepted_per_round"] * stats["spec_rounds"])
        said += (f"; {committed} tokens in rounds of {stats['round_s']:.2f} s: draft {stats['draft_s']:.2f}, verify {stats['verify_s']:.2f}, "
                 f"overhead {stats['overhead_s']:.2f}; sequences {dict(stats['sequences_hist'])}; "
                 f"{stats['target_only_rounds']} target-only steps")
    return said + (f", fallback: {stats['fallback']}" if stats.get("fallback") else "")


if __name__ == "__main__":
    sys.exit(main())
