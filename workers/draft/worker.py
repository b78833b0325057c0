"""The draft worker process: prefills and drafts windows (and branches) with the draft model.

python -m hetspec.workers.draft --endpoint ENDPOINT --spec JSON   (started by hetspec.launcher)
"""
from __future__ import annotations

import os
import time

import numpy as np

from hetspec.core.branches import to_slot
from hetspec.core.sampling import GREEDY, Rule
from hetspec.ipc.messages import (
    CalibrateDraft,
    DraftBatch,
    DraftCalibration,
    Drafted,
    DraftedBatch,
    DraftExtended,
    DraftWindow,
    PrefillDraft,
    Prefilled,
    WorkerHello,
)
from hetspec.ipc.specs import DraftSpec
from hetspec.workers.common.process import parse_args, serve
from hetspec.workers.common.thread_pinning import borrowed_cores, pin, pin_threads, set_torch_threads
from hetspec.workers.draft.backends import load_draft_model
from hetspec.workers.draft.batch_drafter import BatchDrafter
from hetspec.workers.draft.drafter import Drafter
from hetspec.workers.draft.thread_choice import fastest_threads


class DraftState:
    def __init__(self, spec: DraftSpec):
        if spec.backend == "torch":
            set_torch_threads(spec.threads)
        self.model, self.backend, self.kernels = load_draft_model(spec)
        self.kv_geometry = self.model.kv_geometry() if spec.prompt_kv == "auto" else []
        self.native = self.backend == "native"
        # a cache per request where the native model holds several (batch_drafter.py), else one for all
        self.drafter = Drafter(self.model, spec.n_ctx, spec.caches if self.native else 1)
        self.request_id = None
        self.spec = spec
        self.threads = spec.threads
        # the native model's own thread pool (pool.h), pinned a thread a core; its steps can be halted
        self.thread_ids = self.model.thread_ids if self.native else None
        if self.native:
            self.kernels += self._native_threads()
        # the cores its threads use: a native draft measured at fewer threads than cores keeps the first ones
        self.cores = spec.cores[:self.threads] if self.native else spec.cores
        # drafts for several requests at once (batch.py): the native model only
        self.batch = BatchDrafter(self.drafter, spec.vocab) if self.native and spec.caches > 1 else None

    def _native_threads(self) -> str:
        """Set the native step's thread count: measured where the config leaves it to the
        engine (thread_choice.py) and there are several cores; for the description."""
        cores = self.spec.cores
        if self.spec.measure_threads and len(cores) > 1:
            self.threads, timed = fastest_threads(self.model, cores)
            return (f", {self.threads} thread{'s' * (self.threads > 1)} "
                    f"(fastest of {', '.join(map(str, timed))} measured at start-up)")
        self.threads = self.model.set_threads(self.spec.threads)
        return f", {self.threads} thread{'s' * (self.threads > 1)}"

    def prefill(self, context: np.ndarray, reuse_cache: bool, borrow: bool, kv=None, kv_length: int = 0) -> None:
        """Catch up with context, on the target's cores too when lent (the target waits
        meanwhile); with kv_length, the first kv_length tokens' cache is the target's."""
        if kv_length:
            self.model.import_kv(kv[0, :, :, :kv_length], kv[1, :, :, :kv_length])
            self.drafter.adopt(context[:kv_length])
        lent = self.spec.borrow_cores if borrow else []
        with borrowed_cores(self.cores, lent, self.model.set_threads, self.threads, self.thread_ids):
            self.drafter.sync(context, reuse_cache or kv_length > 0)
        self.rest()

    def rest(self) -> None:
        """A command's work is done: the native model's pool threads sleep rather than spin."""
        if self.native:
            self.model.rest()

    def halt_flag(self, buffers) -> np.ndarray | None:
        """The flag the scheduler sets once it has the target's verdict (DraftLink.halt),
        cleared for the window now drafted; None where the model's steps cannot be halted
        (llama.cpp, torch: an extension stops between steps)."""
        if not self.native or "halt" not in buffers:
            return None
        flag = buffers["halt"].array
        flag[0] = 0
        return flag


def load(spec: DraftSpec):
    pin(spec.cores)
    start = time.perf_counter()
    state = DraftState(spec)
    pin_threads(state.cores, state.threads, state.thread_ids)   # the model's thread pool exists now
    hello = WorkerHello(role="draft", pid=os.getpid(), n_vocab=state.model.n_vocab, device="cpu",
                        cores=state.cores, threads=state.threads, load_s=time.perf_counter() - start,
                        backend=state.backend, kernels=state.kernels, kv_geometry=state.kv_geometry,
                        caches=len(state.drafter.lengths),
                        prefill_threads=True)   # on borrowed cores (the native model: its window products' pool)
    return hello, state


def prefill(state: DraftState, cmd: PrefillDraft, buffers) -> Prefilled:
    start = time.perf_counter()
    state.request_id = cmd.request_id                  # a new request, or its next turn: a fresh random stream
    state.drafter.rng = np.random.default_rng([cmd.seed, 1, cmd.context_len])
    kv = buffers["kv"].array if "kv" in buffers else None   # shared with the target, when handing over
    state.drafter.use(cmd.cache)
    state.prefill(buffers["context"].array[:cmd.context_len], cmd.reuse_cache, cmd.borrow_cores, kv, cmd.kv_length)
    return Prefilled(cmd.request_id, time.perf_counter() - start)


def draft(state: DraftState, cmd: DraftWindow, buffers):
    start = time.perf_counter()
    halt = state.halt_flag(buffers)
    state.drafter.use(cmd.cache)
    if cmd.request_id != state.request_id:             # drafting without a prefill (e.g. calibration, tests)
        state.request_id = cmd.request_id
        state.drafter.rng = np.random.default_rng([cmd.sampling.seed, 1, cmd.context_len])
    out = state.drafter.draft(buffers["context"].array[:cmd.context_len], cmd.gamma, cmd.sampling, cmd.branches)
    branches, probs = to_slot(out.branches), to_slot(out.probs)
    flat = [t for branch in branches for t in branch]
    tokens = buffers["tokens"].array[cmd.slot]
    tokens[:len(flat)] = flat
    if probs:
        buffers["probs"].array[cmd.slot, :len(flat)] = np.concatenate([np.stack(rows) for rows in probs])
    reply = Drafted(cmd.request_id, cmd.slot, [len(b) for b in branches], time.perf_counter() - start)
    room = len(tokens) - (len(flat) - len(branches[-1]))      # the likeliest (last) branch may grow to this
    limit = min(cmd.branches.extend_to, room) if cmd.branches else 0
    if limit <= len(branches[-1]):
        state.rest()
        return reply
    return reply, _extension(state, cmd, buffers, len(flat), limit, start, halt)


def _extension(state: DraftState, cmd: DraftWindow, buffers, total: int, limit: int, start: float, halt):
    """Work between commands: the likeliest branch grows a token at a time, each
    written to the slot before the message that announces it. It ends at `limit`,
    at the next command, or (halt) midway through a step once the scheduler has the
    target's verdict, so that the next window's command never waits for a step."""
    for token, row in state.drafter.extend(limit, halt):
        buffers["tokens"].array[cmd.slot, total] = token
        if row is not None:
            buffers["probs"].array[cmd.slot, total] = row
        total += 1
        yield DraftExtended(cmd.command, cmd.slot, total, time.perf_counter() - start)
    state.rest()


def draft_batch(state: DraftState, cmd: DraftBatch, buffers) -> DraftedBatch:
    """Windows for several requests at once, each from its own cache (batch.py)."""
    if state.batch is None:
        raise ValueError("this draft drafts no batch: only the native backend does, with [decoding] batch_drafts")
    start = time.perf_counter()
    contexts = buffers["contexts"].array
    windows = [(w.cache, contexts[w.cache, :w.context_len], w.sampling) for w in cmd.windows]
    if any(w.sampling.rule is Rule.UNKEYED for w in cmd.windows) or len({w.cache for w in cmd.windows}) < len(windows):
        raise ValueError("a draft batch takes greedy and keyed windows, a cache at most once")
    tokens, lengths, cached = state.batch.draft(windows, cmd.gamma, cmd.catch_up)
    buffers["drafts"].array[[w.cache for w in cmd.windows], :cmd.gamma] = tokens
    return DraftedBatch(lengths, cached, time.perf_counter() - start)


def calibrate(state: DraftState, cmd: CalibrateDraft, buffers) -> DraftCalibration:
    """Time per drafted token after a context of context_len tokens (greedy): the
    fastest of `repeats` drafts, spread over the target's own calibration; and per
    token of that context, read first in one feed as a prompt is."""
    rng = np.random.default_rng(0)
    context = rng.integers(0, state.model.n_vocab, cmd.context_len).astype(np.int32)
    state.drafter.use(0)
    start = time.perf_counter()
    state.drafter.sync(context, reuse=False)
    prefill_s = (time.perf_counter() - start) / len(context)
    best = float("inf")
    for _ in range(max(1, cmd.repeats)):
        state.drafter.sync(context)
        start = time.perf_counter()
        state.drafter.draft(context, cmd.n_tokens, GREEDY)
        best = min(best, (time.perf_counter() - start) / cmd.n_tokens)
    state.rest()
    sizes = sorted({min(n, cmd.batch) for n in (1, 2, 4, 8, 16, 32, 64)}) if cmd.batch > 1 else []
    batch = state.batch.time_steps(sizes) if state.batch is not None and sizes else {}
    return DraftCalibration(best, prefill_s, batch)


def recover(state: DraftState) -> None:
    """After a command failed, the model's cache may not hold what the drafter thinks:
    the next command evaluates its whole context."""
    state.drafter.n_cached = 0


def main(argv=None) -> int:
    endpoint, spec = parse_args(argv, DraftSpec)
    return serve("draft", endpoint, spec, load, {PrefillDraft: prefill, DraftWindow: draft, DraftBatch: draft_batch,
                                                 CalibrateDraft: calibrate}, recover)
