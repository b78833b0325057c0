"""The wait of a short request queued behind a long one: one request at a time
([server] max_running = 1, as the engine ran before requests took turns)
against turns (the config's max_running and turn_s).

    python -m hetspec.benchmarks.turns [--config smollm2] [--long 2000] [--short 16] --out DIR

For each setting, in one run on one machine: the long and the short request
alone (their outputs and times), then the long one again, and once it has
streamed its first tokens, the short one. Reported: the short request's wait
(sent to finished, and sent to its first token), the long request's time
against alone, and whether both outputs equal their outputs alone (greedy).
Writes OUT/turns.json and OUT/turns.md.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import hetspec
from hetspec.benchmarks.machine import describe_machine
from hetspec.config import load_config

LONG_PROMPT = "1, 2, 3, 4, 5,"     # a continuation that keeps going
SHORT_PROMPT = "The capital of France is"
HEAD_START_S = 1.0                 # the long request decodes this long before the short one arrives


def measure(config: dict, long_tokens: int, short_tokens: int) -> dict:
    with hetspec.launch(config) as engine:
        alone_long = engine.generate(LONG_PROMPT, max_new_tokens=long_tokens)
        alone_short = engine.generate(SHORT_PROMPT, max_new_tokens=short_tokens)
        long = engine.stream(LONG_PROMPT, max_new_tokens=long_tokens)
        started = time.perf_counter()
        next(long)
        reader = threading.Thread(target=lambda: [None for _ in long], daemon=True)
        reader.start()
        time.sleep(HEAD_START_S)
        sent = time.perf_counter()
        short = engine.stream(SHORT_PROMPT, max_new_tokens=short_tokens)
        first = None
        for _ in short:
            first = first or time.perf_counter()
        done = time.perf_counter()
        reader.join()
        long_s = time.perf_counter() - started
        return {
            "max_running": engine.info["config"]["server"]["max_running"],
            "turn_s": engine.info["config"]["server"]["turn_s"],
            "short_wait_s": done - sent, "short_first_token_s": (first or done) - sent,
            "short_alone_s": alone_short.stats["total_s"],
            "long_s": long_s, "long_alone_s": alone_long.stats["total_s"],
            "long_tokens": len(long.result.token_ids), "short_tokens": len(short.result.token_ids),
            "exact": long.result.token_ids == alone_long.token_ids and short.result.token_ids == alone_short.token_ids,
        }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="smollm2")
    parser.add_argument("--long", type=int, default=2000)
    parser.add_argument("--short", type=int, default=16)
    parser.add_argument("--out", default="turns-out")
    args = parser.parse_args(argv)
    base = load_config(args.config).to_dict()
    base["server"]["max_context"] = max(base["server"]["max_context"], args.long + 64)
    rows = []
    for running in (1, base["server"]["max_running"]):
        config = json.loads(json.dumps(base))
        config["server"]["max_running"] = running
        rows.append(measure(config, args.long, args.short))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine()
    (out / "turns.json").write_text(json.dumps({"config": args.config, "machine": machine, "rows": rows}, indent=1))
    lines = [f"# A {args.short}-token request behind a {args.long}-token one ({args.config})", "",
             (f"`python -m hetspec.benchmarks.turns --config {args.config} --long {args.long} --short {args.short}`; "
              f"the short request is sent {HEAD_START_S:g} s after the long one starts. {machine['cpu']}, "
              f"{machine['logical_cores']} cores, git {machine['git_commit']}; every greedy output compared with "
              "the same request alone."), "",
             ("| setting | short: wait until done | short: wait for its first token | short alone | "
              "long: total | long alone | outputs as alone |"), "|---|---|---|---|---|---|---|"]
    for r in rows:
        setting = "one at a time (max_running 1)" if r["max_running"] == 1 else \
            f"turns (max_running {r['max_running']}, turn_s {r['turn_s']:g})"
        lines.append(f"| {setting} | {r['short_wait_s']:.2f} s | {r['short_first_token_s']:.2f} s | "
                     f"{r['short_alone_s']:.2f} s | {r['long_s']:.1f} s ({r['long_tokens']} tokens) | "
                     f"{r['long_alone_s']:.1f} s | {r['exact']} |")
    (out / "turns.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
