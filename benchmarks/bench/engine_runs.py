"""One benchmark generation through the engine, as a flat record: token ids in (the baselines'
exact prompt), wall time taken by the client, so a method pays for its own orchestration.
"""
from __future__ import annotations

import time

from hetspec.benchmarks.bench.methods import Method
from hetspec.core.errors import EngineDeadError

MAX_RESTARTS = 3


class EngineHolder:
    """One engine for the whole suite, restarted if it dies: one crashed worker must not lose a long run."""

    def __init__(self, config: dict):
        import hetspec

        self._launch = hetspec.launch
        self.config = config
        self.restarts: list[str] = []
        self.engine = self._launch(config)
        self.info = self.engine.info

    def restart(self, reason: str) -> bool:
        """False once MAX_RESTARTS have been used (the remaining runs then fail fast)."""
        if len(self.restarts) >= MAX_RESTARTS:
            return False
        self.restarts.append(f"{reason} (exit codes: {self._exit_codes()})")
        self.close()
        try:
            self.engine = self._launch(self.config)
        except Exception as exc:  # noqa: BLE001 - then every later engine run fails, and says so
            self.restarts.append(f"restart failed: {type(exc).__name__}: {exc}")
            return False
        return True

    def _exit_codes(self) -> dict:
        """The engine's processes' exit codes (negative: killed by that signal), for the record."""
        launcher = getattr(self.engine, "_launcher", None)    # diagnostics only: not public API
        processes = getattr(launcher, "processes", {}) or {}
        return {role: p.poll() for role, p in processes.items()}

    def close(self) -> None:
        if self.engine is not None:
            try:
                self.engine.close()
            finally:
                self.engine = None


def poor_draft_config(config: dict, n_vocab: int) -> dict:
    """The same engine with a draft that never agrees: a tiny random model of the target's vocabulary
    (a builtin target lends its tokenizer; any other gets byte tokens, so a bridged vocabulary)."""
    from hetspec.models import RANDOM_TOKENIZERS

    target = str((config.get("target") or {}).get("model", "builtin:smollm2"))
    name = target.removeprefix("builtin:")
    tokenizer = f",tokenizer={name}" if target.startswith("builtin:") and name in RANDOM_TOKENIZERS else ""
    return {**config, "draft": {"backend": "torch", "model": f"random:vocab={n_vocab},seed=7{tokenizer}"}}


def run_engine(engine, method: Method, gamma: int | None, prompt_ids: list[int], max_new_tokens: int,
               temperature: float, top_p: float, seed: int) -> dict:
    # cache_prompt=False: every method sees the prompt cold, as the baselines do; the
    # draft would otherwise keep the prompt from the previous method's run of it.
    request = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": 0,
               "seed": seed, "mode": method.mode, "cache_prompt": False}
    if method.gamma_offset is not None:   # the sweep fixes gamma; the others run the engine's own budget
        request["gamma"] = gamma
    if method.mode == "duodec":
        request["sequences"] = method.sequences
    if method.speculation:
        request["speculation"] = method.speculation
    if engine is None:
        raise EngineDeadError("the engine died and could not be restarted")
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
