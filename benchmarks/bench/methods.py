"""The methods compared side by side, by name. Engine methods are requests to one engine; `sps` and
`duodec` run as a user's requests do (they may rest), the ablations force speculation. A new method is
a row of METHODS (and, for a new kind, a branch in runner._Suite._generate).
"""
from __future__ import annotations

from dataclasses import dataclass

FORCED = "always"          # a request's speculation: every round speculates
CPP_PEER = "llama-bench"   # llama.cpp's own llama-bench on every core: what the report's "vs llama.cpp" divides by


@dataclass(frozen=True)
class Method:
    name: str
    kind: str                   # "baseline" (transformers generate, in-process), "cpp" (llama.cpp's binaries), "engine"
    label: str                  # how the report names it
    mode: str = ""              # engine: duodec, sequential, target; cpp: bench, spec, ngram-*
    sequences: int | str | None = None     # engine duodec: 1, 2, 3 or "dynamic"
    fixed_gamma: bool = False              # engine: draft the start-up budget's gamma every round
    speculation: str | None = None         # engine: FORCED, or None for the engine's ("auto")
    threads: int | None = None             # cpp: None for every core of the benchmark process

    def gamma(self, chosen: int) -> int | None:
        """The draft budget this method starts with (None for methods that do not draft)."""
        return None if self.kind != "engine" or self.mode == "target" else chosen

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
    Method("sps", "engine", "SpS (engine, sequential)", "sequential"),
    Method("sps-fixed", "engine", "SpS, gamma fixed at the budget", "sequential", fixed_gamma=True, speculation=FORCED),
    *[Method(f"duodec-s{k}", "engine", f"DuoDecoding, {k} sequence{'s' * (k > 1)}", "duodec", k, speculation=FORCED)
      for k in (1, 2, 3)],
    Method("duodec", "engine", "DuoDecoding, dynamic sequences", "duodec", "dynamic"),
]}

GROUPS = {
    "all": tuple(METHODS),
    "baselines": ("vanilla", "target", "sps", "sps-fixed"),
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
