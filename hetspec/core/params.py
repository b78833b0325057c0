"""What one request asks for: SamplingParams, checked once on construction, and
the prompt check. The same object travels from Engine.generate, the CLI and
the wire into both workers, so every parameter is defined here and nowhere else.

Every number is bounded here, whoever sent it: NaN, infinities and integers
past a bound are refused with a RequestError naming the field. The engine then
applies its own limits (its context, max_gamma, max_sequences, its per-request
maximum of new tokens) in scheduler/resolve.py.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from enum import Enum

from hetspec.core.branches import DYNAMIC, Dynamic
from hetspec.core.errors import RequestError


class Choice(str, Enum):
    """A closed set of words: each compares, prints and travels as its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class Mode(Choice):
    """How a request decodes (scheduler/decoding/decoder.py)."""
    DUODEC = "duodec"            # DuoDecoding: the draft drafts the next window while the target verifies this one
    SEQUENTIAL = "sequential"    # ordinary speculative decoding (SpS): draft, then verify
    TARGET = "target"            # the target alone
    LOOKUP = "lookup"            # the target alone, verifying prompt-lookup guesses (no draft)

    @property
    def drafts(self) -> bool:
        """The mode speculates with the draft (the others need no draft worker)."""
        return self in (Mode.DUODEC, Mode.SEQUENTIAL)


class Speculation(Choice):
    """Whether a request may rest from speculating (scheduler/decoding/gate.py)."""
    AUTO = "auto"                # target-only rounds while speculating does not pay
    ALWAYS = "always"            # every round speculates

MAX_INT32 = 2**31 - 1        # token counts, token ids, top_k
MAX_SEED = 2**63 - 1
MAX_TEMPERATURE = 100.0      # far past any useful value; a bound, so that nothing absurd reaches a kernel
MAX_TIMEOUT_S = 86400.0      # one day
MAX_WINDOW = 1024            # gamma and sequences (an engine allows its [decoding] max_gamma / max_sequences)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0             # 0: greedy
    top_p: float = 1.0
    top_k: int = 0                       # 0: off
    seed: int | None = None              # None: a fresh one per request
    stop: tuple[str, ...] = ()           # stop strings (not included in the output)
    mode: Mode = Mode.DUODEC
    gamma: int | None = None             # draft budget; None: the engine's (measured at start-up)
    sequences: int | Dynamic | None = None   # draft branches: a number, DYNAMIC, or None: the config's
    cache_prompt: bool = True            # the draft may keep a matching prefix from an earlier request
    timeout_s: float | None = None       # a deadline from arrival: then finish_reason "timeout", tokens so far
    speculation: Speculation | None = None   # None: the config's ([decoding] speculation)

    def __post_init__(self):
        """Each field checked by its rule (RULES, in the order the errors are raised) and kept
        as the rule returns it: plain ints and floats (numpy's too), Choices, a tuple of stops."""
        for name, rule in RULES:
            object.__setattr__(self, name, rule(name, getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def make(cls, params: SamplingParams | dict | None = None, **overrides) -> SamplingParams:
        """From an existing SamplingParams or a dict (e.g. off the wire), with keyword
        overrides; an unknown name is a RequestError that lists the known ones."""
        _check(params is None or isinstance(params, (SamplingParams, dict)),
               f"params must be a SamplingParams or a dict, got {type(params).__name__}")
        values = dataclasses.asdict(params) if isinstance(params, SamplingParams) else dict(params or {})
        values.update(overrides)
        unknown = sorted(show(k) for k in set(values) - FIELDS)
        _check(not unknown, f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELDS))}")
        return cls(**values)


FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


def _integer(low: int, high: int, alternatives: str = "", optional: bool = False):
    """A rule: an integer in low..high (or None, if optional), kept as a plain int."""
    def rule(name: str, value):
        if optional and value is None:
            return None
        _check_int(name, value, low, high, alternatives)
        return int(value)
    return rule


def _temperature(name: str, value) -> float:
    _check_real(name, value, 0, MAX_TEMPERATURE)
    return float(value)


def _top_p(name: str, value) -> float:
    _check(_is_real(value) and 0 < value <= 1, f"top_p must be in (0, 1], got {show(value)}")
    return float(value)


def _stop(name: str, value) -> tuple[str, ...]:
    stop = [value] if isinstance(value, str) else value
    _check(isinstance(stop, (list, tuple)) and all(isinstance(s, str) and s for s in stop),
           "stop must be a non-empty string or a list of non-empty strings")
    for i, s in enumerate(stop):
        check_text(f"stop string {i}", s)
    return tuple(stop)


def _mode(name: str, value) -> Mode:
    _check(_one_of(value, Mode), f"unknown mode {show(value)}; modes: {', '.join(Mode.values())}")
    return Mode(value)


def _speculation(name: str, value) -> Speculation | None:
    _check(value is None or _one_of(value, Speculation),
           f"speculation must be one of {', '.join(Speculation.values())} or None, got {show(value)}")
    return None if value is None else Speculation(value)


def _sequences(name: str, value):
    if value == DYNAMIC or value is None:
        return value
    return _integer(1, MAX_WINDOW, ", 'dynamic' or None")(name, value)


def _flag(name: str, value) -> bool:
    _check(isinstance(value, bool), f"{name} must be true or false, got {show(value)}")
    return value


def _timeout(name: str, value) -> float | None:
    if value is None:
        return None
    _check(_is_real(value) and 0 < value <= MAX_TIMEOUT_S,
           f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] or None, got {show(value)}")
    return float(value)


RULES = (
    ("stop", _stop),
    ("max_new_tokens", _integer(1, MAX_INT32)),
    ("temperature", _temperature),
    ("top_p", _top_p),
    ("top_k", _integer(0, MAX_INT32, " (0 disables it)")),
    ("seed", _integer(0, MAX_SEED, " or None", optional=True)),
    ("mode", _mode),
    ("speculation", _speculation),
    ("gamma", _integer(1, MAX_WINDOW, " or None", optional=True)),
    ("sequences", _sequences),
    ("cache_prompt", _flag),
    ("timeout_s", _timeout),
)


def check_prompt(prompt, messages) -> str | list[int] | None:
    """Exactly one of a prompt (text or token ids) and chat messages; returns the
    prompt with token ids as plain ints."""
    _check((prompt is None) != (messages is None), "give exactly one of prompt or messages")
    if messages is not None:
        _check(isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages), "messages must be a non-empty list of {'role': str, 'content': str}")
        for i, m in enumerate(messages):
            check_text(f"messages[{i}].role", m["role"])
            check_text(f"messages[{i}].content", m["content"])
        return None
    if isinstance(prompt, str):
        _check(prompt != "", "prompt is empty")
        check_text("the prompt", prompt)
        return prompt
    _check(isinstance(prompt, (list, tuple)),
           f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
    _check(len(prompt) > 0, "prompt is empty")
    _check(all(_is_int(t) and t >= 0 for t in prompt), "a token-id prompt must be a list of non-negative integers")
    return [int(t) for t in prompt]


def check_text(what: str, text: str) -> None:
    """Text a tokenizer can take: UTF-8 encodable (a lone surrogate, which JSON's
    escapes and Python's str allow, is not), named by its position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{what} is not valid text: its character {exc.start} is a lone surrogate "
                           f"(U+{ord(text[exc.start]):04X}), which has no UTF-8 encoding") from None


def show(value, limit: int = 60) -> str:
    """A value as an error message quotes it: its repr (which escapes surrogates and
    control characters), cut short."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a caller's object whose repr fails is still named
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."


def _check(ok, message: str) -> None:
    if not ok:
        raise RequestError(message)


def _check_int(name: str, value, low: int, high: int, alternatives: str = "") -> None:
    _check(_is_int(value) and low <= value <= high,
           f"{name} must be an integer in {low}..{high}{alternatives}, got {show(value)}")


def _check_real(name: str, value, low: float, high: float) -> None:
    _check(_is_real(value) and low <= value <= high, f"{name} must be a number in [{low:g}, {high:g}], got {show(value)}")


def _one_of(value, choices: type[Choice]) -> bool:
    return isinstance(value, str) and value in choices.values()


def _is_int(value) -> bool:
    """(A plain int first: a token-id prompt checks each of its ids, and the ABC's isinstance is slow.)"""
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _is_real(value) -> bool:
    """A finite real number: not NaN, not an infinity, not an integer past float's range."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
