"""Every message that crosses a process boundary, as a plain dataclass.

How one travels is codec.py's: two zmq frames, a type tag and a small JSON
object. Anything large (token windows, draft branches, probability rows)
travels in shared memory (ipc/shm.py); a message only says where to look.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hetspec.core.branches import Dynamic
from hetspec.core.sampling import Sampling

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
    backend: str = ""         # what runs the model: "native", "llama.cpp", "transformers" (target) or "torch"
    kernels: str = ""         # how the model runs, e.g. "llama.cpp f16" or "onednn prepacked (211 linear layers)"
    kv_geometry: list[int] = field(default_factory=list)  # [layers, kv_heads, head_dim, full-attention layers]
                                                          # of a cache that can be handed over (target) or
                                                          # taken (draft); [] if not
    prefill_threads: bool = True  # the model prefills faster on more threads (borrowed cores): every
                                  # draft backend does now (the native one splits its window products)
    caches: int = 1           # target: the caches it keeps, the requests stepped together at most
                              # ([server] max_running; "auto": what its device holds); draft: a
                              # request's own (1: one cache for all)


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
class PrefillDraft:
    """Bring the draft's cache up to date with the `context_len` tokens in its
    context buffer, drafting nothing. Answered by Prefilled."""
    request_id: int
    context_len: int
    seed: int                  # the request's: the draft's random stream for its windows
    reuse_cache: bool = True   # False: evaluate the whole context afresh (no prefix kept from before)
    borrow_cores: bool = False  # run on the target's cores as well, the target waiting
    kv_length: int = 0         # > 0: first take the cache of the first kv_length tokens from the shared
                               # "kv" buffer (the target's, see ExportKV), and evaluate only the rest
    cache: int = 0             # the request's draft cache (its target cache's number)


@dataclass
class Prefilled:
    request_id: int
    seconds: float


@dataclass
class BranchPlan:
    """How a pipelined window branches: its first token is the target's to choose
    (it comes out of the verify pass running meanwhile), so the draft proposes up
    to `max_sequences` branches, each starting with a different candidate."""
    sequences: int | Dynamic   # a number, or DYNAMIC (hetspec.core.branches)
    max_sequences: int
    acceptance: float          # the request's per-token acceptance so far: sizes dynamic branches
    extend_to: int = 0         # > gamma: after replying, keep growing the likeliest branch up to this
                               # many tokens, one DraftExtended each, until the next message arrives


@dataclass
class DraftWindow:
    """Draft `gamma` tokens after the `context_len` tokens in the context buffer into
    output slot `slot`: one plain sequence, or with `branches` the pipeline's next
    window. Answered by Drafted; probability rows come with it only under the
    unkeyed rule."""
    request_id: int
    command: int               # numbers the command, so a late DraftExtended is recognised as stale
    context_len: int
    gamma: int
    sampling: Sampling
    slot: int                  # which half of the double-buffered output to write
    branches: BranchPlan | None = None
    cache: int = 0             # the request's draft cache (PrefillDraft's)


@dataclass
class Drafted:
    """Branch lengths in slot order (hetspec.core.branches.to_slot); tokens and,
    when sampling unkeyed, probability rows are in the output slot."""
    request_id: int
    slot: int
    lengths: list[int]
    seconds: float


@dataclass
class DraftExtended:
    """The likeliest (last) branch of command `command` grew by one token while
    the draft waited for its next command: `total` tokens are now in the slot,
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
class BatchWindow:
    """One request's part of a DraftBatch: its context is row `cache` of the "contexts"
    buffer, its first `context_len` tokens."""
    request_id: int
    cache: int                 # the request's own draft cache (its target cache's number)
    context_len: int
    sampling: Sampling         # greedy or keyed (an unkeyed window needs probability rows: none in a batch)


@dataclass
class DraftBatch:
    """Several requests stepped together (scheduler/batch.py): each request's cache first
    takes its context, at most `catch_up` tokens of it; those whose cache then holds the
    whole context get `gamma` tokens drafted, one pass of the model for all of them a
    token, into their row of the "drafts" buffer. gamma 0: the caches only catch up
    (beside the target's pass). Answered by DraftedBatch."""
    windows: list[BatchWindow]
    gamma: int
    catch_up: int


@dataclass
class DraftedBatch:
    lengths: list[int]         # tokens drafted for each window (0: its cache was still catching up)
    cached: list[int]          # tokens each window's cache now holds of its context
    seconds: float


@dataclass
class CalibrateDraft:
    context_len: int
    n_tokens: int              # per timed draft
    repeats: int = 1           # timed drafts; the fastest counts
    batch: int = 0             # > 1: also time a batched draft step (DraftBatch) of 2, 4, ... up to this many


@dataclass
class DraftCalibration:
    seconds_per_token: float            # a drafted token
    prefill_seconds_per_token: float    # a token of the context, read in one feed first
    batch_seconds: dict = field(default_factory=dict)   # requests -> a batched draft step (str keys: JSON);
                                                        # {} where the draft cannot draft a batch


# ---- target worker ---------------------------------------------------------

@dataclass
class VerifyCommand:
    """Crop the KV cache `cache` to `keep` tokens, run the `n_tokens` tokens in the
    target's input buffer and write the next-token choice (argmax or keyed draw, by
    the rule) and, under the unkeyed rule, the probability rows, for the last
    `rows` of them."""
    request_id: int
    keep: int
    n_tokens: int
    rows: int                    # how many trailing positions need an answer
    sampling: Sampling
    borrow_cores: bool = False   # use the draft's cores too (prompt prefill)
    cache: int = 0               # which request's cache: each admitted request keeps its own (requests take turns)
    ahead: int = 0               # then decode up to this many tokens alone, each after the last choice
                                 # (greedy and keyed rules): a RanAhead each, until the next message comes
    run: int = 0                 # the scheduler's number for this command, which its RanAhead messages echo


@dataclass
class VerifyBatch:
    """Several requests' verify passes run as one (scheduler/batch.py): command i's
    tokens follow command i-1's in the input buffer, and its answer rows follow
    command i-1's in "choice" (and in "probs", where its rule is unkeyed). Each
    command names its own cache, a cache at most once; their `ahead` is 0. Answered
    by one Verified."""
    commands: list[VerifyCommand]
    borrow_cores: bool = False


@dataclass
class Verified:
    request_id: int
    seconds: float


@dataclass
class RanAhead:
    """A token the target decoded after its last answer without being asked again
    (VerifyCommand.ahead): the scheduler takes it as that step's answer where its
    context is the one the target ran from, so the step costs no round trip."""
    request_id: int
    run: int
    position: int                # the chosen token's index in the sequence
    after: int                   # the token before it, which this pass ran
    token: int                   # the target's choice (argmax or keyed draw)
    seconds: float


@dataclass
class ExportKV:
    """Target: write the first `length` positions of KV cache `cache` to the shared
    "kv" buffer, float16, (2, layers, kv_heads, positions, head_dim)."""
    request_id: int
    length: int
    cache: int = 0


@dataclass
class KVExported:
    request_id: int
    seconds: float


@dataclass
class CalibrateTarget:
    context_len: int
    sizes: list[int]
    borrow_cores: bool = False      # timed on the draft's cores too
    budget_s: float = 0.0           # stop after the size at which the passes have taken this long (0: every size)


@dataclass
class TargetCalibration:
    seconds: list[float]


# ---- clients (Engine) <-> scheduler ----------------------------------------

@dataclass
class GenerateRequest:
    """A prompt (text or token ids) or chat messages, and the request's parameters
    as a SamplingParams dict: the scheduler builds (and so checks) them itself, and
    can name the request in its answer however a client filled them."""
    request_id: int
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    params: dict = field(default_factory=dict)
    token: str = ""           # the engine's [server] api_key, when it has one


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
    finish_reason: str        # "eos", "stop", "length", "cancelled" or "timeout"
    stats: dict = field(default_factory=dict)


@dataclass
class RequestFailed:
    request_id: int
    kind: str                 # see hetspec.core.errors.ERROR_KINDS
    message: str


@dataclass
class CancelRequest:
    """Stop request `request_id` at its next round (or drop it from the queue); it
    then finishes with finish_reason "cancelled" and the tokens it has."""
    request_id: int
    token: str = ""


@dataclass
class InfoRequest:
    token: str = ""


@dataclass
class EngineInfo:
    info: dict


@dataclass
class StopEngine:
    """Ask the scheduler to stop its workers and exit."""
    token: str = ""
