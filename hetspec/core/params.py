"""What one request asks for: SamplingParams, checked once on construction, and
the prompt check. The same object travels from Engine.generate, the CLI and
the wire into both workers, so every parameter is defined here and nowhere else.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from hetspec.core.errors import RequestError

MODES = ("duodec", "sequential", "target")   # pipelined DuoDecoding, ordinary SpS, the target alone
SPECULATION = ("auto", "always")   # auto: target-only rounds while speculating does not pay (scheduler/gate.py)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0             # 0: greedy
    top_p: float = 1.0
    top_k: int = 0                       # 0: off
    seed: int | None = None              # None: a fresh one per request
    stop: tuple[str, ...] = ()           # stop strings (not included in the output)
    mode: str = "duodec"                 # see MODES
    gamma: int | None = None             # draft budget; None: the engine's (measured at start-up)
    sequences: int | str | None = None   # draft branches: a number, "dynamic", or None: the config's
    cache_prompt: bool = True            # the draft may keep a matching prefix from an earlier request
    timeout_s: float | None = None       # a deadline from arrival: then finish_reason "timeout", tokens so far
    speculation: str | None = None       # see SPECULATION; None: the config's ([decoding] speculation)

    def __post_init__(self):
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        _check(isinstance(stop, (list, tuple)) and all(isinstance(s, str) and s for s in stop),
               "stop must be a non-empty string or a list of non-empty strings")
        object.__setattr__(self, "stop", tuple(stop))
        _check(_is_int(self.max_new_tokens) and self.max_new_tokens > 0,
               f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        _check(_is_real(self.temperature) and 0 <= self.temperature < math.inf,
               f"temperature must be a finite number >= 0, got {self.temperature!r}")
        _check(_is_real(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(_is_int(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        _check(self.seed is None or (_is_int(self.seed) and self.seed >= 0),
               f"seed must be a non-negative integer or None, got {self.seed!r}")
        _check(self.mode in MODES, f"unknown mode {self.mode!r}; modes: {', '.join(MODES)}")
        _check(self.speculation is None or self.speculation in SPECULATION,
               f"speculation must be one of {', '.join(SPECULATION)} or None, got {self.speculation!r}")
        _check(self.gamma is None or (_is_int(self.gamma) and self.gamma >= 1),
               f"gamma must be a positive integer or None, got {self.gamma!r}")
        _check(self.sequences in (None, "dynamic") or (_is_int(self.sequences) and self.sequences >= 1),
               f"sequences must be 'dynamic', a positive integer or None, got {self.sequences!r}")
        _check(isinstance(self.cache_prompt, bool), f"cache_prompt must be true or false, got {self.cache_prompt!r}")
        _check(self.timeout_s is None or (_is_real(self.timeout_s) and 0 < self.timeout_s < math.inf),
               f"timeout_s must be a number of seconds > 0 or None, got {self.timeout_s!r}")
        for name in ("temperature", "top_p"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def make(cls, params: SamplingParams | dict | None = None, **overrides) -> SamplingParams:
        """From an existing SamplingParams or a dict (e.g. off the wire), with keyword
        overrides; an unknown name is a RequestError that lists the known ones."""
        values = dataclasses.asdict(params) if isinstance(params, SamplingParams) else dict(params or {})
        values.update(overrides)
        unknown = sorted(set(values) - FIELDS)
        _check(not unknown, f"unknown parameter(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(FIELDS))}")
        return cls(**values)


FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


def check_prompt(prompt, messages) -> str | list[int] | None:
    """Exactly one of a prompt (text or token ids) and chat messages; returns the
    prompt with token ids as plain ints."""
    _check((prompt is None) != (messages is None), "give exactly one of prompt or messages")
    if messages is not None:
        _check(isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages), "messages must be a non-empty list of {'role': str, 'content': str}")
        return None
    if isinstance(prompt, str):
        _check(prompt != "", "prompt is empty")
        return prompt
    _check(isinstance(prompt, (list, tuple)),
           f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
    _check(len(prompt) > 0, "prompt is empty")
    _check(all(_is_int(t) and t >= 0 for t in prompt), "a token-id prompt must be a list of non-negative integers")
    return [int(t) for t in prompt]


def _check(ok, message: str) -> None:
    if not ok:
        raise RequestError(message)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
