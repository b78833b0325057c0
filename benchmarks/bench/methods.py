"""The methods compared side by side, by name. Engine methods are requests to one engine (the
"poor" ones to a second engine whose draft never agrees); the gamma sweep is relative to the
budget the engine chose, so a method list is the same experiment on any machine. `sps` and
`duodec` run as a user's requests do (they may rest); the ablations force speculation.
"""
from __future__ import annotations

from dataclasses import dataclass

FORCED = "always"          # a request's speculation: every round speculates
CPP_PEER = "llama-bench"   # llama.cpp's own llama-bench on every core: what the report's "vs llama.cpp" divides by


@dataclass(frozen=True)
class Method:
    name: str
    kind: str                   # "baseline" (transformers, in-process), "cpp" (llama.cpp's binaries), "engine", "poor"
    label: str                  # how the report names it
    mode: str = ""              # engine: duodec, sequential, target; baseline: vanilla, pld; cpp: bench, spec, ngram-*
    sequences: int | str | None = None     # engine duodec: 1, 2, 3 or "dynamic"
    gamma_offset: int | None = None        # engine: gamma = chosen + offset; None: the engine's own budget
    speculation: str | None = None         # engine: FORCED, or None for the engine's ("auto")
    threads: int | None = None             # cpp: None for every core of the benchmark process

    def gamma(self, chosen: int, max_gamma: int) -> int | None:
        """The draft budget this method runs with (None for methods that do not draft)."""
        if self.kind in ("baseline", "cpp") or self.mode == "target":
            return None
        return min(max(1, chosen + (self.gamma_offset or 0)), max_gamma)

    def rebalanced(self, measured_budget: bool) -> bool:
        """On the measured budget, DuoDecoding and SpS redraw each round's length: windows may pass gamma."""
        return self.mode in ("duodec", "sequential") and self.gamma_offset is None and measured_budget


def _sweep(offset: int) -> Method:
    label = f"DuoDecoding, gamma {'+-'[offset < 0]} {abs(offset)}"
    return Method(f"gamma{offset:+d}", "engine", label, "duodec", "dynamic", offset, FORCED)


METHODS = {m.name: m for m in [
    Method("vanilla", "baseline", "Vanilla (transformers generate)", "vanilla"),
    Method("llama-bench-1t", "cpp", "llama.cpp (llama-bench, C++), 1 thread", "bench", threads=1),
    Method(CPP_PEER, "cpp", "llama.cpp (llama-bench, C++), every core", "bench"),
    Method("llama-spec", "cpp", "llama.cpp speculative (llama-speculative-simple, C++, the draft's GGUF; greedy)",
           "spec"),
    *[Method(f"llama-{kind}", "cpp", f"llama.cpp n-gram speculation (llama-speculative-simple {kind}, C++; greedy)",
             kind) for kind in ("ngram-simple", "ngram-mod")],
    Method("target", "engine", "Engine, target only", "target"),
    Method("sps", "engine", "SpS (engine, sequential)", "sequential"),
    Method("sps-fixed", "engine", "SpS, gamma fixed at the budget", "sequential", None, 0, FORCED),
    Method("pld", "baseline", "PLD (transformers prompt lookup)", "pld"),
    *[Method(f"duodec-s{k}", "engine", f"DuoDecoding, {k} sequence{'s' * (k > 1)}", "duodec", k, None, FORCED)
      for k in (1, 2, 3)],
    Method("duodec", "engine", "DuoDecoding, dynamic sequences", "duodec", "dynamic"),
    *[_sweep(offset) for offset in (-2, -1, 1, 2)],
    Method("poor", "poor", "Poor draft (never agrees), DuoDecoding", "duodec", "dynamic"),
    Method("poor-forced", "poor", "Poor draft, speculation forced", "duodec", "dynamic", speculation=FORCED),
]}

SWEEP = ("gamma-2", "gamma-1", "duodec", "gamma+1", "gamma+2")    # the paper's Table 3, "duodec" at offset 0
GROUPS = {
    "all": tuple(METHODS),
    "baselines": ("vanilla", "target", "sps", "sps-fixed", "pld"),
    "peers": tuple(name for name, m in METHODS.items() if m.kind == "cpp"),
    "sequences": ("duodec-s1", "duodec-s2", "duodec-s3", "duodec"),
    "sweep": SWEEP,
    "poor": ("poor", "poor-forced"),
    "headline": ("vanilla", CPP_PEER, "target", "sps", "duodec", "poor", "poor-forced"),
}


def select_methods(names) -> list[Method]:
    """Method or group names (comma-separated too), in METHODS' order; vanilla always: every speedup divides by it."""
    wanted = {"vanilla"}
    for part in (p.strip() for name in (names or ["all"]) for p in str(name).split(",")):
        if part and part not in GROUPS and part not in METHODS:
            raise ValueError(f"unknown method {part!r}; known: {', '.join([*GROUPS, *METHODS])}")
        wanted.update(GROUPS.get(part, (part,)))
    return [m for name, m in METHODS.items() if name in wanted]
