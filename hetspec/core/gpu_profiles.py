"""Named costs of a GPU target's passes, for the paced target (workers/target/paced.py):
a stand-in for a GPU that charges each pass its profile's time, so the paper's setting
(a GPU target, a CPU draft) can be built and measured on a machine without one.

A pass of n tokens costs `window_ms` up to `flat_to` tokens (a GPU reads the weights
once for a small window: the verify curve is flat), then `per_token_ms` a token more;
a prompt pass costs `window_ms` plus `prefill_ms_per_token` a token.

Besides the named profiles below, a profile may be a report of benchmarks/gpu_profile.py
(a path ending .json): its `paced_profile` object, measured on a GPU, holds these fields.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class GpuProfile:
    name: str
    window_ms: float             # a pass of 1..flat_to tokens
    flat_to: int
    per_token_ms: float          # each token of a pass beyond flat_to
    prefill_ms_per_token: float  # each token of a prompt pass, on top of window_ms
    source: str                  # where the numbers come from

    def pass_s(self, n_tokens: int, rows: int) -> float:
        """Seconds of a pass of n_tokens reading `rows` rows of logits: a prompt pass
        reads fewer rows than it feeds tokens; a verify window reads them all."""
        if rows < n_tokens:
            return (self.window_ms + self.prefill_ms_per_token * n_tokens) / 1000
        return (self.window_ms + self.per_token_ms * max(0, n_tokens - self.flat_to)) / 1000


PROFILES = {p.name: p for p in [
    GpuProfile("h100-7b-eager", 21.0, 32, 0.05, 0.035,
               "measured: a Llama-2-7B-shaped bfloat16 target run eagerly by transformers on one H100, "
               "18.4-23.6 ms a pass of 1 to 32 tokens (benchmarks/reports/gpu-profile-h100, two runs); "
               "prompt tokens at 7B's compute on an H100 (projected)"),
    GpuProfile("h100-7b-captured", 7.5, 8, 0.1, 0.035,
               "projected: the same target's 7.5 ms of kernels a one-token pass, and one linear layer "
               "costing the same for 1 to 8 rows (benchmarks/reports/gpu-profile-h100, probe.log), "
               "until a captured target measures it"),
    GpuProfile("gpu-40ms", 40.0, 16, 0.5, 0.2,
               "a 14-70B-class target, or a 7B one on a consumer GPU: 40 ms a pass (round figure)"),
]}


def profile(name: str) -> GpuProfile:
    """The named profile, or a report's (a path ending .json); ValueError naming the known
    ones, or what is wrong with the report."""
    if name.endswith(".json"):
        return from_report(name)
    if name not in PROFILES:
        raise ValueError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILES)} (or a gpu_profile report, .json)")
    return PROFILES[name]


def from_report(path: str) -> GpuProfile:
    """The `paced_profile` object of a JSON report (benchmarks/gpu_profile.py writes one), checked
    field by field: the paced target would otherwise fail on it in a worker, or pace nonsense."""
    try:
        with open(path, encoding="utf-8") as file:
            doc = json.load(file)
    except OSError as exc:
        raise ValueError(f"GPU profile {path!r}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"GPU profile {path!r} is not JSON: {exc}") from None
    found = doc.get("paced_profile") if isinstance(doc, dict) else None
    if not isinstance(found, dict):     # the file's content is wrong, not the caller's argument's type
        raise ValueError(f"GPU profile {path!r} holds no paced_profile object "  # noqa: TRY004
                         "(a report of benchmarks/gpu_profile.py has one)")
    names = [f.name for f in fields(GpuProfile)]
    if set(found) != set(names):
        raise ValueError(f"GPU profile {path!r}: paced_profile must have exactly the fields {', '.join(names)}; "
                         f"missing {sorted(set(names) - set(found))}, unknown {sorted(set(found) - set(names))}")
    for key in names:
        if want := _wanted(key, found[key]):
            raise ValueError(f"GPU profile {path!r}: paced_profile's {key} must be {want}, got {found[key]!r}")
    return GpuProfile(**found)


def _wanted(key: str, value) -> str:
    """What field `key` must be, where `value` is not that; else ""."""
    if key in ("name", "source"):
        return "" if isinstance(value, str) and value else "a non-empty string"
    if key == "flat_to":
        return "" if type(value) is int and value >= 1 else "an integer >= 1"
    number = type(value) in (int, float) and math.isfinite(value)
    if key == "window_ms":
        return "" if number and value > 0 else "a number > 0"
    return "" if number and value >= 0 else "a number >= 0"
