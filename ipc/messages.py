"""Every message that crosses a process boundary, as a plain dataclass.

A message travels as two zmq frames: a one-byte type tag and a small JSON
header. Anything large (token windows, draft branches, probability rows)
travels in shared memory (ipc/shm.py); a message only says where to look.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

# ---- worker lifecycle (scheduler <-> draft and target workers) -------------

@dataclass
class WorkerHello:
    """Sent by a worker once its model is loaded."""
    role: str                 # "draft" or "target"
    pid: int
    n_vocab: int
    device: str
    cores: list[int]
    threads: int
    load_s: float
    eos_token_ids: list[int] = field(default_factory=list)   # from the target's generation config
    kernels: str = ""         # how the model runs, e.g. "llama.cpp f16" or "onednn prepacked (211 linear layers)"
    kv_geometry: list[int] = field(default_factory=list)  # [layers, kv_heads, head_dim, full-attention layers]
                                                          # of a cache that can be handed over (target) or
                                                          # taken (draft); [] if not
    prefill_threads: bool = True  # the model prefills faster on more threads (borrowed cores); the
                                  # native draft runs one thread, one token a pass


@dataclass
class WorkerFailed:
    """A worker could not load or could not carry out a command."""
    role: str
    message: str
    fatal: bool = True


@dataclass
class AttachBuffers:
    """Shared-memory segments for a worker: name -> [segment, shape, dtype]."""
    buffers: dict[str, list]


@dataclass
class Attached:
    role: str


@dataclass
class Shutdown:
    pass


# ---- draft worker ----------------------------------------------------------

@dataclass
class DraftCommand:
    """Draft after the `context_len` tokens in the draft's context buffer.

    speculative=True: the next window of the pipeline; its first token is left
    to the target, so the draft proposes up to `sequences` branches, each
    starting with a different candidate first token. speculative=False: one
    ordinary draft sequence (sequential decoding)."""
    request_id: int
    context_len: int
    n_tokens: int
    speculative: bool
    sequences: int | str       # an integer, or "dynamic"
    max_sequences: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    slot: int                  # which half of the double-buffered output to write
    acceptance: float = 0.8    # the request's per-token acceptance so far: sizes dynamic branches
    reuse_cache: bool = True   # False: evaluate the whole context afresh (no prefix kept from before)
    borrow_cores: bool = False  # run on the target's cores as well (a prefill while the target waits)
    extend_to: int = 0         # > n_tokens: after replying, keep extending the likeliest branch up to
                               # this many tokens, one DraftExtended each, until the next message arrives
    command: int = 0           # numbers the command, so a late DraftExtended is recognised as stale
    kv_length: int = 0         # > 0: first take the cache of the context's first kv_length tokens from the
                               # shared "kv" buffer (the target's, ExportKV), and evaluate only the rest


@dataclass
class Drafted:
    """Branch lengths, in slot order: the likeliest branch is the last one, so an
    extension (DraftExtended) grows the end of the slot. Tokens and probability
    rows are in the output slot."""
    request_id: int
    slot: int
    lengths: list[int]
    seconds: float
    forward_passes: int


@dataclass
class DraftExtended:
    """The likeliest branch of command `command` grew by one token while the
    draft waited for its next command: `total` tokens are now in the slot,
    drafted in `seconds` since the command arrived."""
    command: int
    slot: int
    total: int
    seconds: float


@dataclass
class Idle:
    """Nothing more to do for now: its arrival stops any work between commands
    (an extension). It has no reply."""


@dataclass
class CalibrateDraft:
    context_len: int
    n_tokens: int              # per timed draft
    repeats: int = 1           # timed drafts; the fastest counts


@dataclass
class DraftCalibration:
    seconds_per_token: float


# ---- target worker ---------------------------------------------------------

@dataclass
class VerifyCommand:
    """Crop the KV cache to `keep` tokens, run the `n_tokens` tokens in the
    target's input buffer and write the next-token choice (and, when sampling,
    the probability rows) for the last `rows` of them."""
    request_id: int
    keep: int
    n_tokens: int
    rows: int                    # how many trailing positions need an answer
    temperature: float
    top_p: float
    top_k: int
    borrow_cores: bool = False   # use the draft's cores too (prompt prefill)


@dataclass
class Verified:
    request_id: int
    seconds: float


@dataclass
class ExportKV:
    """Target: write the first `length` positions of the request's KV cache to the
    shared "kv" buffer, float16, (2, layers, kv_heads, positions, head_dim)."""
    request_id: int
    length: int


@dataclass
class KVExported:
    request_id: int
    seconds: float


@dataclass
class CalibrateTarget:
    context_len: int
    sizes: list[int]


@dataclass
class TargetCalibration:
    seconds: list[float]


# ---- clients (Engine) <-> scheduler ----------------------------------------

@dataclass
class GenerateRequest:
    request_id: int
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | None = None
    mode: str = "duodec"
    gamma: int | None = None
    sequences: int | str | None = None
    cache_prompt: bool = True     # the draft may reuse its cache of an earlier request's matching prefix


@dataclass
class TokensEvent:
    """Tokens committed in one round and the text they complete."""
    request_id: int
    token_ids: list[int]
    text: str


@dataclass
class Finished:
    request_id: int
    token_ids: list[int]
    text: str
    finish_reason: str        # "eos", "stop" or "length"
    stats: dict = field(default_factory=dict)


@dataclass
class RequestFailed:
    request_id: int
    kind: str                 # see hetspec.errors.ERROR_KINDS
    message: str


@dataclass
class InfoRequest:
    pass


@dataclass
class EngineInfo:
    info: dict


@dataclass
class StopEngine:
    """Ask the scheduler to stop its workers and exit."""


_TYPES = [
    WorkerHello, WorkerFailed, AttachBuffers, Attached, Shutdown,
    DraftCommand, Drafted, CalibrateDraft, DraftCalibration,
    VerifyCommand, Verified, CalibrateTarget, TargetCalibration,
    GenerateRequest, TokensEvent, Finished, RequestFailed, InfoRequest, EngineInfo, StopEngine,
    DraftExtended, Idle,   # appended: the tags of the others stay as they were
    ExportKV, KVExported,
]
_TAG_OF = {cls: bytes([i]) for i, cls in enumerate(_TYPES)}
_CLASS_OF = {tag: cls for cls, tag in _TAG_OF.items()}
_FIELD_NAMES = {cls: frozenset(f.name for f in fields(cls)) for cls in _TYPES}


def encode(message) -> list[bytes]:
    # Every field is a plain value (no nested dataclass): the instance dict is the message.
    return [_TAG_OF[type(message)], json.dumps(vars(message)).encode()]


def decode(frames: list[bytes]):
    if len(frames) != 2 or frames[0] not in _CLASS_OF:
        raise ValueError(f"malformed message: {len(frames)} frame(s)")
    cls = _CLASS_OF[frames[0]]
    values = json.loads(frames[1])
    if not isinstance(values, dict):
        raise TypeError(f"malformed {cls.__name__}: not a JSON object")
    unexpected = values.keys() - _FIELD_NAMES[cls]
    if unexpected:
        raise ValueError(f"malformed {cls.__name__}: unexpected fields {sorted(unexpected)}")
    return cls(**values)
