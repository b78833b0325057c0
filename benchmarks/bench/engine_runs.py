"""One benchmark generation through the engine, as a flat record: token ids in (the baselines'
exact prompt), wall time taken by the client, so a method pays for its own orchestration.
"""
from __future__ import annotations

import time

from hetspec.benchmarks.bench.methods import Method


def run_engine(engine, method: Method, gamma: int | None, prompt_ids: list[int], max_new_tokens: int,
               temperature: float, top_p: float, seed: int) -> dict:
    # cache_prompt=False: every method sees the prompt cold, as the baselines do; the
    # draft would otherwise keep the prompt from the previous method's run of it.
    request = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": 0,
               "seed": seed, "mode": method.mode, "cache_prompt": False}
    if method.fixed_gamma:                # the others run the engine's own budget
        request["gamma"] = gamma
    if method.mode == "duodec":
        request["sequences"] = method.sequences
    if method.speculation:
        request["speculation"] = method.speculation
    start, first_piece = time.perf_counter(), None     # the first streamed text: the time to first token, as a client's
    stream = engine.stream(list(prompt_ids), **request)
    for _ in stream:
        first_piece = first_piece or time.perf_counter()
    return _record(stream.result, time.perf_counter() - start, first_piece and first_piece - start)


def _record(result, wall: float, first_piece_s: float | None) -> dict:
    s = result.stats
    spec_rounds, target_only = int(s.get("spec_rounds", 0)), int(s.get("target_only_rounds", 0))
    new_tokens = int(s.get("new_tokens", len(result.token_ids)))
    # No text at all (all held back): the engine's own figure plus the time outside the decoder.
    outside = max(0.0, wall - s.get("total_s", wall))
    ttft = first_piece_s if first_piece_s is not None else s.get("ttft_s", 0.0) + outside
    return {
        "token_ids": list(result.token_ids), "new_tokens": new_tokens, "finish_reason": result.finish_reason,
        "total_s": wall, "ttft_s": ttft, "engine_total_s": s.get("total_s"), "gamma": s.get("gamma"),
        **{k: int(s.get(k, 0)) for k in ("rounds", "spec_rounds", "target_only_rounds", "drafted", "accepted")},
        # every token but the prefill's and the target-only rounds' (with their lookup guesses)
        "committed_in_spec_rounds": max(0, new_tokens - 1 - target_only - int(s.get("lookup_accepted", 0)))
        if spec_rounds else 0,
        "engine_committed_in_spec_rounds": round(s.get("mean_accepted_per_round", 0.0) * spec_rounds),
        "branch_hits": int(s.get("branch_hits", 0)),
        "sequences_hist": {str(k): int(v) for k, v in (s.get("sequences_hist") or {}).items()},
        **{k: s.get(k, 0.0) for k in ("draft_s", "verify_s", "round_s", "overhead_s")},
        **{k: int(s.get(k, 0)) for k in ("rested", "lookup_guessed", "lookup_accepted")},
        "fallback": s.get("fallback"),       # why the target ran without the draft, where it did
    }
