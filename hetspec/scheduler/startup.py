"""The scheduler's start-up steps, in the order Scheduler.start runs them."""
from __future__ import annotations

import dataclasses
import filecmp
import math
import os

import numpy as np

from hetspec.config import AUTO, EngineConfig
from hetspec.core.errors import ConfigError, EngineStartError
from hetspec.ipc.messages import CalibrateDraft, CalibrateTarget, WorkerHello
from hetspec.ipc.shm import SharedArray, segment_name
from hetspec.ipc.specs import ModelSpec, RunSpec, TargetSpec
from hetspec.scheduler.decoding.bridge import check_expressible, describe_vocabularies
from hetspec.scheduler.decoding.budget import CostModel, choose_gamma, monotone
from hetspec.scheduler.decoding.links import DraftLink, TargetLink, WorkerLost
from hetspec.scheduler.decoding.request import Capabilities
from hetspec.scheduler.supervisor import Crew, Worker
from hetspec.scheduler.tokenizer import Tokenizer, kept_tokenizer

CALIBRATION_CONTEXT = 128
CALIBRATION_BUDGET_S = 4.0  # verify passes timed at start-up, at most about this long (larger sizes extrapolated)
ALONE_CONTEXT = 16        # tokens before the timed passes of borrows_cores
VERIFY_SIZES = [1, 2, 4, 6, 8, 10, 12, 16, 24, 32]


def draft_tokenizer(draft: ModelSpec, target: ModelSpec, target_tokenizer: Tokenizer) -> Tokenizer | None:
    """The draft's tokenizer (None: the draft is the target's own file). One whose kept files
    are the target's shares its object: a large vocabulary's second copy holds 50 MB."""
    if (draft.kind, draft.file, draft.random) == (target.kind, target.file, target.random):
        return None
    if same_files(kept_tokenizer(draft), kept_tokenizer(target)):
        return target_tokenizer
    try:
        return Tokenizer(draft)
    except ConfigError as exc:
        raise EngineStartError(f"the draft's tokenizer: {exc} (a draft that is another model than the target "
                               "needs its own tokenizer files, even if it shares the target's vocabulary)") from None


def same_files(a: str, b: str) -> bool:
    """Two folders holding files of the same names and bytes (False where either is missing)."""
    if not (a and b and os.path.isdir(a) and os.path.isdir(b)) or sorted(os.listdir(a)) != sorted(os.listdir(b)):
        return False
    return all(filecmp.cmp(os.path.join(a, name), os.path.join(b, name), shallow=False) for name in os.listdir(a))


def wait_for_workers(crew: Crew, links: tuple[DraftLink, TargetLink], timeout_s: float) -> dict[str, WorkerHello]:
    """Each worker's hello once loaded; one that dies meanwhile fails the start, with its log."""
    hellos = {}
    for link in links:
        try:
            message = link.wait(timeout_s)
        except WorkerLost as lost:
            log = "\n".join(crew.workers[link.role].last_log_lines())
            raise EngineStartError(f"{lost} while loading its model; its last log lines:\n{log}") from None
        if isinstance(message, WorkerHello):
            link.hello = hellos[link.role] = message
            crew.workers[link.role].ready()
    return hellos


def check_vocabularies(target: Tokenizer, draft: Tokenizer | None, hellos: dict[str, WorkerHello],
                       draft_model: ModelSpec) -> str | None:
    """How the vocabularies differ (None: one), once each tokenizer is known to fit its model."""
    for role, tokenizer in (("target", target), ("draft", draft)):
        n_vocab = hellos[role].n_vocab
        if tokenizer and tokenizer.size is not None and tokenizer.size > n_vocab:   # (bytes: a test model's)
            raise EngineStartError(f"the {role}'s tokenizer has {tokenizer.size} tokens but its model only "
                                   f"{n_vocab}: they do not belong together")
    differ = draft and describe_vocabularies(target, draft, hellos["target"].n_vocab, hellos["draft"].n_vocab)
    if differ:
        check_expressible(draft, draft_model.file or "random")
    return differ or None


def with_running(config: EngineConfig, target: WorkerHello, worker: Worker) -> EngineConfig:
    """The config with [server] max_running as the target holds it. Only a CUDA target's "auto"
    gets here (config.py resolves the others); a restarted target gets that number, not a
    new fit: free memory may have shrunk, and every running request's cache must be there."""
    if config.server.max_running != AUTO:
        return config
    at = worker.args.index("--spec") + 1
    spec = TargetSpec.from_json(worker.args[at])
    worker.args[at] = dataclasses.replace(spec, caches=target.caches, fit_caches=False).to_json()
    return dataclasses.replace(config, server=dataclasses.replace(config.server, max_running=target.caches))


def answer_rows(config: EngineConfig) -> int:
    """Answer rows a pass may ask for: a window, its bonus token and one more; a batch's, one each."""
    return max(config.decoding.max_gamma + 2, config.server.max_running)


def attach_buffers(config: EngineConfig, run_id: str, draft: DraftLink, target: TargetLink,
                   hellos: dict[str, WorkerHello]) -> SharedArray | None:
    """Each worker's shared buffers; returns the one a prompt's KV cache crosses in (None: none)."""
    rows = answer_rows(config)
    max_tokens = config.server.max_context + rows
    # The draft reports a cache shape only with [draft] prompt_kv = "auto": one it
    # can take from the target when the target's has the same (a quantized copy).
    geometry, kv_buffer = hellos["draft"].kv_geometry, None
    if geometry and geometry == hellos["target"].kv_geometry:
        layers, heads, head_dim, _ = geometry
        kv_buffer = SharedArray.create(segment_name(run_id, "kv"), (2, layers, heads, max_tokens, head_dim), np.float16)
    shared = {"kv": kv_buffer} if kv_buffer is not None else {}
    branch_rows = rows + config.decoding.max_sequences
    target.attach(run_id, {"input": ((max_tokens,), np.int32), "choice": ((rows,), np.int32),
                           "probs": ((rows, hellos["target"].n_vocab), np.float32)}, shared)
    draft.attach(run_id, {"context": ((max(max_tokens, config.draft.n_ctx),), np.int32),
                          "tokens": ((2, branch_rows), np.int32),
                          "probs": ((2, branch_rows, hellos["draft"].n_vocab), np.float32),
                          "halt": ((1,), np.int32),               # DraftLink.halt
                          # a batch's drafts (batch.py): a row each of the requests' caches
                          "contexts": ((config.server.max_running, max(max_tokens, config.draft.n_ctx)), np.int32),
                          "drafts": ((config.server.max_running, config.decoding.max_gamma), np.int32)}, shared)
    return kv_buffer


def calibrate(config: EngineConfig, draft: DraftLink, target: TargetLink) -> tuple[int, dict, CostModel | None]:
    """(gamma, how it was chosen, the cost model): "auto" times both workers at once, as they run."""
    decoding = config.decoding
    if decoding.gamma != AUTO:
        return decoding.gamma, {"source": "config"}, None
    sizes = [n for n in VERIFY_SIZES if n <= decoding.max_gamma + 1]
    context = min(CALIBRATION_CONTEXT, config.server.max_context // 2)
    batch = config.server.max_running if config.decoding.batch_drafts else 0
    draft.send(CalibrateDraft(context, 8, repeats=6, batch=batch))
    target.send(CalibrateTarget(context, sizes, budget_s=CALIBRATION_BUDGET_S))
    verify_s = monotone(dict(zip(sizes, target.wait().seconds)))
    timed = draft.wait()
    draft_s, prefill_s = timed.seconds_per_token, timed.prefill_seconds_per_token
    gamma = choose_gamma(draft_s, verify_s, decoding.max_gamma)
    info = {"source": "measured", "context": context, "draft_s_per_token": draft_s,
            "draft_prefill_s_per_token": prefill_s, "verify_s": {str(k): v for k, v in verify_s.items()},
            "batch_draft_s": timed.batch_seconds}
    costs = CostModel(draft_s, verify_s, prefill_s)
    costs.batch_draft_s = {int(n): seconds for n, seconds in timed.batch_seconds.items()}
    return gamma, info, costs


def borrows_cores(config: EngineConfig, target: TargetLink, device: str) -> tuple[bool, float, bool]:
    """(alone, pace, batch): whether the target alone, and a batch's pass, take the draft's cores
    too: as configured, or ("auto") where that is 5% faster (on a small CPU a second thread can
    cost more than it gains); and the alone token's speed-up so, which speculation must beat."""
    choice = config.target.alone_borrows_draft_cores
    if choice != AUTO or device != "cpu" or not set(config.draft.cores) - set(config.target.cores):
        return choice is True and device == "cpu", 1.0, choice is True and device == "cpu"
    context, n = min(ALONE_CONTEXT, config.server.max_context // 2), min(config.server.max_running, 64)
    sizes = [1, 1, 1] + ([n, n, n] if n > 1 else [])

    def fastest(borrow: bool) -> tuple[float, float]:
        target.send(CalibrateTarget(context, sizes, borrow_cores=borrow))
        seconds = target.wait().seconds
        return min(seconds[:3]), min(seconds[3:], default=math.inf)

    (borrowed, batch_borrowed), (own, batch_own) = fastest(True), fastest(False)
    alone = borrowed < 0.95 * own
    return alone, borrowed / own if alone else 1.0, batch_borrowed < 0.95 * batch_own


def capabilities(config: EngineConfig, hellos: dict[str, WorkerHello], kv_handover: bool,
                 alone_borrows: bool, batch_borrows: bool, differ: str | None) -> Capabilities:
    keep = config.decoding.keep_drafting
    # Beside a CPU target a draft that never rests slows verifying (one memory bus); not beside a GPU.
    keep_drafting = hellos["target"].device != "cpu" if keep == AUTO else keep
    return Capabilities(
        max_gamma=config.decoding.max_gamma, max_sequences=config.decoding.max_sequences,
        borrow_cores=config.target.prefill_borrows_draft_cores,
        alone_borrows_cores=alone_borrows, batch_borrows_cores=batch_borrows,
        draft_borrows_cores=config.draft.prefill_borrows_target_cores and hellos["draft"].prefill_threads,
        keep_drafting=keep_drafting, kv_handover=kv_handover, lookup=config.decoding.lookup,
        batch_drafts=config.decoding.batch_drafts and config.server.max_running > 1 and not differ
        and hellos["draft"].backend == "native")


def describe(config: EngineConfig, endpoint: str, gamma: int, budget: dict, caps: Capabilities, differ: str | None,
             hellos: dict[str, WorkerHello], spec: RunSpec) -> dict:
    """The engine's info as clients see it (Engine.get_info)."""
    n_target, n_draft = hellos["target"].n_vocab, hellos["draft"].n_vocab
    return {
        "pid": os.getpid(), "launcher_pid": spec.launcher_pid, "endpoint": endpoint,
        "scheduler": {"restarts": spec.restarts, "deaths": spec.deaths}, "gamma": gamma, "budget": budget,
        "keep_drafting": caps.keep_drafting, "lookup": caps.lookup,
        "prompt_kv": "target" if caps.kv_handover else "own",
        "alone_borrows_draft_cores": caps.alone_borrows_cores, "batch_borrows_draft_cores": caps.batch_borrows_cores,
        "batch_drafts": caps.batch_drafts,
        "n_vocab": n_target, "vocabulary": _vocabulary(differ, n_target, n_draft),
        "config": _redacted(config.to_dict()),
        "draft": _worker_info(hellos["draft"]), "target": _worker_info(hellos["target"]),
    }


def _redacted(config: dict) -> dict:
    """The config as clients may see it: never the API key."""
    if config["server"].get("api_key"):
        config["server"]["api_key"] = "(set)"
    return config


def _vocabulary(differ: str | None, n_target: int, n_draft: int) -> dict:
    """How the draft's tokens become the target's (bridge.py)."""
    bridge = f"text: {differ}" if differ else "none: the draft and the target use the same tokens"
    return {"shared": not differ, "target": n_target, "draft": n_draft, "bridge": bridge}


def _worker_info(hello: WorkerHello) -> dict:
    return {"pid": hello.pid, "device": hello.device, "cores": hello.cores, "threads": hello.threads,
            "load_s": round(hello.load_s, 3), "backend": hello.backend, "kernels": hello.kernels}
