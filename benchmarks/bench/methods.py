"""The methods compared side by side, by name. Engine methods are requests to one engine; `sps` and
`duodec` run as a user's requests do (they may rest), the ablations force speculation. A new method is
a row of METHODS (and, for a new kind, a branch in runner._Suite._generate). run_engine runs one
generation of an engine method as a flat record: token ids in (the baselines' exact prompt), wall time
taken by the client, so that a method pays for its own orchestration."""
from __future__ import annotations

import time
from dataclasses import dataclass

FORCED = "always"          # a request's speculation: every round speculates
CPP_PEER = "llama-bench"   # llama.cpp's own llama-bench on every core: what the report's "vs llama.cpp" divides by


@dataclass(frozen=True)
class Method:
    name: str
    kind: str                   # "baseline" (transformers generate, in-process), "cpp" (llama.cpp's binaries), "engine"
    label: str                  # how the report names it
    mode: str = ""              # engine: duodec, sequential, target, lookup; cpp: bench, spec, ngram-*
    sequences: int | str | None = None     # engine duodec: 1, 2, 3 or "dynamic"
    fixed_gamma: bool = False              # engine: draft the start-up budget's gamma every round
    speculation: str | None = None         # engine: FORCED, or None for the engine's ("auto")
    threads: int | None = None             # cpp: None for every core of the benchmark process

    def gamma(self, chosen: int) -> int | None:
        """The draft budget this method starts with (None for methods that do not draft)."""
        return None if self.kind != "engine" or self.mode in ("target", "lookup") else chosen

    def rebalanced(self, measured_budget: bool) -> bool:
        """On the measured budget, DuoDecoding and SpS redraw each round's length: windows may pass gamma."""
        return self.mode in ("duodec", "sequential") and not self.fixed_gamma and measured_budget


METHODS = {m.name: m for m in [
    Method("vanilla", "baseline", "Vanilla (transformers generate)"),
    Method("llama-bench-1t", "cpp", "llama.cpp (llama-bench, C++), 1 thread", "bench", threads=1),
    Method(CPP_PEER, "cpp", "llama.cpp (llama-bench, C++), every core", "bench"),
    Method("llama-spec", "cpp", "llama.cpp speculative (llama-speculative-simple, C++, the draft's GGUF; greedy)",
           "spec"),
    *[Method(f"llama-{kind}", "cpp", f"llama.cpp n-gram speculation (llama-speculative-simple {kind}, C++; greedy)",
             kind) for kind in ("ngram-simple", "ngram-mod")],
    Method("target", "engine", "Engine, target only", "target"),
    Method("lookup", "engine", "Engine, target verifying prompt-lookup guesses (no draft)", "lookup"),
    Method("sps", "engine", "SpS (engine, sequential)", "sequential"),
    Method("sps-fixed", "engine", "SpS, gamma fixed at the budget", "sequential", fixed_gamma=True, speculation=FORCED),
    *[Method(f"duodec-s{k}", "engine", f"DuoDecoding, {k} sequence{'s' * (k > 1)}", "duodec", k, speculation=FORCED)
      for k in (1, 2, 3)],
    Method("duodec", "engine", "DuoDecoding, dynamic sequences", "duodec", "dynamic"),
]}

GROUPS = {
    "all": tuple(METHODS),
    "baselines": ("vanilla", "target", "lookup", "sps", "sps-fixed"),
    "peers": tuple(name for name, m in METHODS.items() if m.kind == "cpp"),
    "sequences": ("duodec-s1", "duodec-s2", "duodec-s3", "duodec"),
    "headline": ("vanilla", CPP_PEER, "target", "sps", "duodec"),
}


def select_methods(names) -> list[Method]:
    """Method or group names (comma-separated too), in METHODS' order; vanilla always: every speedup divides by it."""
    wanted = {"vanilla"}
    for part in (p.strip() for name in (names or ["all"]) for p in str(name).split(",")):
        if part and part not in GROUPS and part not in METHODS:
            raise ValueError(f"unknown method {part!r}; known: {', '.join([*GROUPS, *METHODS])}")
        wanted.update(GROUPS.get(part, (part,)))
    return [m for name, m in METHODS.items() if name in wanted]


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
        **{k: int(s.get(k, 0)) for k in ("rested", "lookup_guessed", "lookup_accepted", "round_lookup_guessed",
                                         "round_lookup_accepted")},
        "fallback": s.get("fallback"),       # why the target ran without the draft, where it did
    }
