"""How a message (messages.py) crosses a process boundary: two zmq frames, a
one-byte type tag and a JSON object (nested dataclasses, such as Sampling, as JSON
objects; a Choice as its value). Decoding checks every field against the type its dataclass
declares, so a message from anywhere (a client built without hetspec, a
fuzzer) either is well-formed or is Malformed, with what is wrong named.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import MISSING, fields

from hetspec.core.errors import RequestError
from hetspec.core.params import Choice, show
from hetspec.ipc.messages import (
    AttachBuffers,
    Attached,
    CalibrateDraft,
    CalibrateTarget,
    CancelRequest,
    DraftBatch,
    DraftCalibration,
    Drafted,
    DraftedBatch,
    DraftExtended,
    DraftWindow,
    EngineInfo,
    ExportKV,
    Finished,
    GenerateRequest,
    Idle,
    InfoRequest,
    KVExported,
    PrefillDraft,
    Prefilled,
    RanAhead,
    RequestFailed,
    Shutdown,
    StopEngine,
    TargetCalibration,
    TokensEvent,
    Verified,
    VerifyBatch,
    VerifyCommand,
    WorkerFailed,
    WorkerHello,
)

MAX_MESSAGE_BYTES = 64 * 2**20   # a message's JSON at most; the scheduler's socket drops larger ones unread

TYPES = [
    WorkerHello, WorkerFailed, AttachBuffers, Attached, Shutdown,
    PrefillDraft, Prefilled, DraftWindow, Drafted, DraftExtended, Idle, CalibrateDraft, DraftCalibration,
    VerifyCommand, Verified, ExportKV, KVExported, CalibrateTarget, TargetCalibration,
    GenerateRequest, TokensEvent, Finished, RequestFailed, InfoRequest, EngineInfo, StopEngine, CancelRequest,
    RanAhead, VerifyBatch, DraftBatch, DraftedBatch,
]
TAG_OF = {cls: bytes([i]) for i, cls in enumerate(TYPES)}   # each message type's tag
_CLASS_OF = {tag: cls for cls, tag in TAG_OF.items()}


def encode(message) -> list[bytes]:
    header = _ENCODER.encode(message).encode()
    if len(header) > MAX_MESSAGE_BYTES:
        raise RequestError(f"the {type(message).__name__} is {len(header)} bytes of JSON; an engine takes "
                           f"messages of at most {MAX_MESSAGE_BYTES} bytes")
    return [TAG_OF[type(message)], header]


def _fields(value) -> dict:
    """A dataclass as the JSON encoder meets it (the message, or one nested in it), one
    level at a time: dataclasses.asdict's deep copy took most of a round trip's encoding."""
    try:
        names = _names(type(value))
    except TypeError:          # (fields() of anything but a dataclass; a dataclass itself has type `type`)
        raise TypeError(f"{type(value).__name__} is not JSON serializable") from None
    return {name: getattr(value, name) for name in names}


_ENCODER = json.JSONEncoder(default=_fields)   # json.dumps(message, default=_fields), made once: messages cross every round


class Malformed(ValueError):
    """Frames that are no message: what is wrong, and the request_id they name, if any
    (so that a client is answered about its own request)."""

    def __init__(self, message: str, request_id: int = -1):
        super().__init__(message)
        self.request_id = request_id


def decode(frames: list[bytes]):
    """A message from its frames; Malformed names what is wrong with them."""
    if len(frames) != 2 or frames[0] not in _CLASS_OF:
        raise Malformed(f"malformed message: {len(frames)} frame(s)")
    cls = _CLASS_OF[frames[0]]
    try:
        values = json.loads(frames[1])
    except RecursionError:
        raise Malformed(f"malformed {cls.__name__}: its JSON is nested too deeply") from None
    except ValueError as exc:
        raise Malformed(f"malformed {cls.__name__}: not JSON ({exc})") from None
    if not isinstance(values, dict):
        raise Malformed(f"malformed {cls.__name__}: not a JSON object")
    try:
        return build(cls, values)
    except (ValueError, TypeError) as exc:
        rid = values.get("request_id")
        raise Malformed(str(exc), rid if type(rid) is int and -2**63 <= rid < 2**63 else -1) from None


def build(cls, values: dict):
    """A dataclass from its JSON fields, each checked against the type it declares,
    nested dataclasses (Sampling, BranchPlan, lists of them) and choices (Rule) included."""
    checks, required, nested = _plan(cls)
    if values.keys() != checks.keys():         # (every field, as hetspec sends them: nothing to look for)
        _check_names(cls, values, checks, required)
    for name, value in values.items():
        if not checks[name](value):
            raise ValueError(f"malformed {cls.__name__}: {name} must be {_describe(_hints(cls)[name])}, got {show(value)}")
    for name, kind, members in nested:
        value = values.get(name)
        if isinstance(value, dict):
            values[name] = build(kind, value)
        elif isinstance(value, list) and members is None:   # a list of dataclasses (VerifyBatch's commands)
            values[name] = [build(kind, v) if isinstance(v, dict) else v for v in value]
        elif members is not None and isinstance(value, str):
            values[name] = members.get(value) or kind(value)   # (kind(value) says what is wrong)
    return cls(**values)


def _check_names(cls, values: dict, checks: dict, required: list[str]) -> None:
    unexpected = values.keys() - checks.keys()
    if unexpected:
        raise ValueError(f"malformed {cls.__name__}: unexpected fields {sorted(unexpected)}")
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"malformed {cls.__name__}: missing field(s) {missing}")


@functools.cache
def _checker(hint):
    """Whether a JSON value has the declared type `hint` (ints within 64 bits, floats
    finite), as a function worked out once per type: messages are checked every round."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_checker(arg) for arg in args]

        def fits_one(v) -> bool:
            for fits in options:
                if fits(v):
                    return True
            return False
        return fits_one
    if origin is typing.Literal:
        return lambda v: v in args
    if hint is list or origin is list:
        each = _checker(args[0]) if args else None
        return lambda v: isinstance(v, list) and (each is None or all(map(each, v)))
    if hint is dict or origin is dict:
        return lambda v: isinstance(v, dict)
    return _class_checker(hint)


def _class_checker(hint):
    """_checker for a plain class: a JSON scalar, a Choice (one of its values), a nested
    dataclass (an object), or anything else (not checked)."""
    if hint in _SCALARS:
        return _SCALARS[hint]
    if isinstance(hint, type) and issubclass(hint, Choice):
        allowed = hint.values()
        return lambda v: isinstance(v, str) and v in allowed
    if dataclasses.is_dataclass(hint):
        return lambda v: isinstance(v, (dict, hint))
    return lambda v: True


def _int64(value) -> bool:
    return type(value) is int and -2**63 <= value < 2**63


_SCALARS = {type(None): lambda v: v is None, bool: lambda v: isinstance(v, bool), int: _int64,
            float: lambda v: _int64(v) or (type(v) is float and math.isfinite(v)), str: lambda v: isinstance(v, str)}


def _describe(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is dict:
        return "an object"
    if typing.get_origin(hint) is list:
        return f"a list ({_describe(typing.get_args(hint)[0])} each)" if typing.get_args(hint) else "a list"
    if isinstance(hint, type) and issubclass(hint, Choice):
        return " or ".join(map(repr, hint.values()))
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(map(repr, typing.get_args(hint)))
    names = {type(None): "null", bool: "true or false", int: "a 64-bit integer", float: "a finite number",
             str: "a string", dict: "an object", list: "a list"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


@functools.cache
def _hints(cls) -> dict[str, type]:
    return typing.get_type_hints(cls)


@functools.cache
def _names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@functools.cache
def _plan(cls) -> tuple[dict, list[str], list[tuple[str, type, dict | None]]]:
    """How build checks cls: each field's checker, the fields without a default, and the
    fields whose type is (or may be) a dataclass or a Choice, with a Choice's members by value."""
    hints = _hints(cls)
    checks = {name: _checker(hint) for name, hint in hints.items()}
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    nested = [(name, kind, {m.value: m for m in kind} if _is_choice(kind) else None)
              for name, hint in hints.items() for kind in (typing.get_args(hint) or (hint,))
              if dataclasses.is_dataclass(kind) or _is_choice(kind)]
    return checks, required, nested


def _is_choice(kind) -> bool:
    return isinstance(kind, type) and issubclass(kind, Choice)
