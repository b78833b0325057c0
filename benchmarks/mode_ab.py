"""Modes taking turns on one engine, each prompt in every mode before the next, so that a machine's
drift falls on all alike (`--repeats 2`: the second pass in reverse order; `--speculation always`:
every round of the speculative modes drafts). Prints each request's decode tok/s and what the engine
did, then each mode's pooled tok/s against the first mode's. Exits 1 if greedy outputs disagree.

    python -m hetspec.benchmarks.mode_ab --config gemma3-smollm2 --modes target duodec sequential \\
        --speculation always --categories code continuation --max-new-tokens 64 --repeats 2
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import hetspec
from hetspec.benchmarks.bench.data import ALL_CATEGORIES, load_prompts


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    with hetspec.launch(args.config) as engine:
        print(f"started in {time.perf_counter() - started:.1f} s; gamma {engine.get_info()['gamma']}")
        prompts = load_prompts(args.categories, args.limit)
        engine.generate(prompts[0].text, max_new_tokens=8, mode="target")       # warm: the kernels, the caches
        pooled = {mode: Counter() for mode in args.modes}
        differ = 0
        for repeat in range(args.repeats):
            order = args.modes if repeat % 2 == 0 else args.modes[::-1]
            for prompt in prompts:
                outputs = {_one(engine, prompt, mode, args, pooled[mode]) for mode in order}
                differ += len(outputs) > 1
        reference = _rate(pooled[args.modes[0]])
        for mode, cell in pooled.items():
            held = f", {cell['accepted']}/{cell['drafted']} drafted tokens held" if cell["drafted"] else ""
            print(f"{mode:10} {_rate(cell):7.2f} tok/s  {_rate(cell) / reference:.2f}x {args.modes[0]} "
                  f"({cell['tokens']} tokens, {cell['spec_rounds']} speculative rounds{held})")
        print(f"prompts whose greedy outputs differ between modes: {differ}")
    return 1 if differ else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hetspec.benchmarks.mode_ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="smollm2", help="a shipped config's name or a TOML path")
    parser.add_argument("--modes", nargs="+", default=["target", "duodec"], help="the first is the reference")
    parser.add_argument("--categories", nargs="+", default=["code"], choices=ALL_CATEGORIES)
    parser.add_argument("--limit", type=int, default=4, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--speculation", default="auto", choices=["auto", "always"],
                        help="always: the speculative modes speculate every round (their rounds' profile)")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts, every other one in "
                                                               "reverse mode order")
    return parser


def _one(engine, prompt, mode: str, args, cell: Counter) -> tuple[int, ...]:
    """One request, pooled into its mode's cell; its tokens, to compare with the other modes'."""
    forced = {} if mode == "target" else {"speculation": args.speculation}
    result = engine.generate(prompt.text, max_new_tokens=args.max_new_tokens, mode=mode, **forced)
    stats = result.stats
    tokens, seconds = stats["new_tokens"] - 1, stats["total_s"] - stats["ttft_s"]
    cell.update(tokens=tokens, seconds=seconds, spec_rounds=stats["spec_rounds"], accepted=stats["accepted"],
                drafted=stats["drafted"])
    print(f"{prompt.key:16} {mode:10} {tokens / seconds:7.2f} tok/s  {_did(stats)}", flush=True)
    return tuple(result.token_ids)


def _rate(cell: Counter) -> float:
    return cell["tokens"] / cell["seconds"]


def _did(stats: dict) -> str:
    said = (f"spec rounds {stats['spec_rounds']}, acceptance {stats['acceptance_rate']:.2f}, rested {stats['rested']}, "
            f"lookup {stats['lookup_accepted']}/{stats['lookup_guessed']}")
    if stats["spec_rounds"]:          # where the rounds' time went: drafting, verifying, neither (the scheduler, idle)
        committed = round(stats["mean_accepted_per_round"] * stats["spec_rounds"])
        said += (f"; {committed} tokens in rounds of {stats['round_s']:.2f} s: draft {stats['draft_s']:.2f}, "
                 f"verify {stats['verify_s']:.2f}, overhead {stats['overhead_s']:.2f}; "
                 f"sequences {dict(stats['sequences_hist'])}; {stats['target_only_rounds']} target-only steps")
    return said + (f", fallback: {stats['fallback']}" if stats.get("fallback") else "")


if __name__ == "__main__":
    sys.exit(main())
