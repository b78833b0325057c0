"""The methods compared side by side (docs/performance.md, "How to measure"), by name.

Engine methods are requests to one engine (the "poor" ones: to a second engine whose draft
never agrees); the gamma sweep is relative to the budget it chose, so a method list is the
same experiment on any machine. `sps` and `duodec` run as a user's requests do (the engine
may rest from speculating); the ablations force speculation, each to measure its own setting.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    kind: str                   # "baseline" (transformers, in-process), "peer" (llama-cpp-python, in-process),
                                # "cpp" (llama.cpp's binaries), "engine", or "poor" (the poor-draft engine)
    label: str                  # how the report names it
    mode: str = ""              # engine: "duodec", "sequential" or "target"; baseline: "vanilla" or "pld";
                                # peer: "plain" or "pld"; cpp: "bench", "spec", "ngram-simple" or "ngram-mod"
    sequences: int | str | None = None     # engine duodec: 1, 2, 3 or "dynamic"
    gamma_offset: int | None = None        # engine: gamma = chosen + offset; None: the chosen gamma
    speculation: str | None = None         # engine: "always" forces speculation; None: the engine's ("auto")
    threads: int | None = None             # peer, cpp: None for every core of the benchmark process

    def gamma(self, chosen: int, max_gamma: int) -> int | None:
        """The draft budget this method runs with (None for methods that do not draft)."""
        if self.kind in ("baseline", "peer", "cpp") or self.mode == "target":
            return None
        return min(max(1, chosen + (self.gamma_offset or 0)), max_gamma)

    def rebalanced(self, measured_budget: bool) -> bool:
        """DuoDecoding and SpS on the engine's own measured budget redraw each
        round's length from the rounds' timings: their windows may pass gamma."""
        return self.mode in ("duodec", "sequential") and self.gamma_offset is None and measured_budget

FORCED = "always"          # a request's speculation: every round speculates
PEER = "llama.cpp"         # llama.cpp on every core through llama-cpp-python: results' vs_llama divides by it
CPP_PEER = "llama-bench"   # llama.cpp's own llama-bench on every core: the report's "vs llama.cpp", where it ran

METHODS = {m.name: m for m in [
    Method("vanilla", "baseline", "Vanilla (transformers generate)", "vanilla"),
    Method("llama.cpp-1t", "peer", "llama.cpp via llama-cpp-python (Python loop), 1 thread", "plain", threads=1),
    Method(PEER, "peer", "llama.cpp via llama-cpp-python (Python loop), every core", "plain"),
    Method("llama.cpp-pld", "peer", "llama.cpp via llama-cpp-python, prompt lookup, every core (greedy)", "pld"),
    Method("llama-bench-1t", "cpp", "llama.cpp (llama-bench, C++), 1 thread", "bench", threads=1),
    Method(CPP_PEER, "cpp", "llama.cpp (llama-bench, C++), every core", "bench"),
    Method("llama-spec", "cpp", "llama.cpp speculative (llama-speculative-simple, C++, the draft's GGUF; greedy)",
           "spec"),
    Method("llama-ngram-simple", "cpp", "llama.cpp n-gram speculation (llama-speculative-simple ngram-simple, C++; "
           "greedy)", "ngram-simple"),
    Method("llama-ngram-mod", "cpp", "llama.cpp n-gram speculation (llama-speculative-simple ngram-mod, C++; greedy)",
           "ngram-mod"),
    Method("target", "engine", "Engine, target only", "target"),
    Method("sps", "engine", "SpS (engine, sequential)", "sequential"),
    Method("sps-fixed", "engine", "SpS, gamma fixed at the budget", "sequential", None, 0, FORCED),
    Method("pld", "baseline", "PLD (transformers prompt lookup)", "pld"),
    Method("duodec-s1", "engine", "DuoDecoding, 1 sequence", "duodec", 1, None, FORCED),
    Method("duodec-s2", "engine", "DuoDecoding, 2 sequences", "duodec", 2, None, FORCED),
    Method("duodec-s3", "engine", "DuoDecoding, 3 sequences", "duodec", 3, None, FORCED),
    Method("duodec", "engine", "DuoDecoding, dynamic sequences", "duodec", "dynamic"),
    Method("gamma-2", "engine", "DuoDecoding, gamma - 2", "duodec", "dynamic", -2, FORCED),
    Method("gamma-1", "engine", "DuoDecoding, gamma - 1", "duodec", "dynamic", -1, FORCED),
    Method("gamma+1", "engine", "DuoDecoding, gamma + 1", "duodec", "dynamic", +1, FORCED),
    Method("gamma+2", "engine", "DuoDecoding, gamma + 2", "duodec", "dynamic", +2, FORCED),
    Method("poor", "poor", "Poor draft (never agrees), DuoDecoding", "duodec", "dynamic"),
    Method("poor-forced", "poor", "Poor draft, speculation forced", "duodec", "dynamic", speculation=FORCED),
]}

# The gamma sweep (the paper's Table 3) is these methods plus "duodec" itself (offset 0).
SWEEP = ("gamma-2", "gamma-1", "duodec", "gamma+1", "gamma+2")
GROUPS = {
    "all": tuple(METHODS),
    "baselines": ("vanilla", "target", "sps", "sps-fixed", "pld"),
    "peers": ("llama.cpp-1t", PEER, "llama.cpp-pld", "llama-bench-1t", CPP_PEER, "llama-spec", "llama-ngram-simple",
              "llama-ngram-mod"),
    "sequences": ("duodec-s1", "duodec-s2", "duodec-s3", "duodec"),
    "sweep": SWEEP,
    "poor": ("poor", "poor-forced"),
    "headline": ("vanilla", PEER, CPP_PEER, "target", "sps", "duodec", "poor", "poor-forced"),
}


def select_methods(names) -> list[Method]:
    """Method or group names (comma-separated too), in the canonical order; vanilla always, as
    every speedup divides by it."""
    wanted = {"vanilla"}
    for part in (p.strip() for name in (names or ["all"]) for p in str(name).split(",")):
        if part and part not in GROUPS and part not in METHODS:
            raise ValueError(f"unknown method {part!r}; known: {', '.join([*GROUPS, *METHODS])}")
        wanted.update(GROUPS.get(part, (part,)))
    return [m for name, m in METHODS.items() if name in wanted]
