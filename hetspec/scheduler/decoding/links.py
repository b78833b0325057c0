"""The scheduler's handles on its two workers: inputs go into shared memory, one command goes out, and its reply
(bulk outputs read back from shared memory) is collected later. Waiting never blocks forever: a dead worker raises
WorkerLost, naming it, and the supervisor (supervisor.py) starts it again."""
from __future__ import annotations

import numpy as np
import psutil
import zmq

from hetspec.core.branches import from_slot
from hetspec.core.errors import EngineDeadError, HetspecError
from hetspec.core.sampling import Rule, Sampling
from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import (
    AttachBuffers,
    Attached,
    BatchWindow,
    BranchPlan,
    DraftBatch,
    Drafted,
    DraftedBatch,
    DraftExtended,
    DraftWindow,
    ExportKV,
    Idle,
    KVExported,
    PrefillDraft,
    Prefilled,
    RanAhead,
    Shutdown,
    Verified,
    VerifyBatch,
    VerifyCommand,
    WorkerFailed,
    WorkerHello,
)
from hetspec.ipc.shm import SharedArray, segment_name
from hetspec.scheduler.decoding.round import Draft, Verification

POLL_S = 0.2
READY_LAG = 16           # a draft cache this many tokens behind its context catches up inside the draft's next window
AHEAD_TIMEOUT_S = 60.0   # a token decoded ahead that has not come by then is not coming (its pass failed)


class WorkerError(HetspecError, RuntimeError):
    """A worker could not carry out a command but is still alive (it logged why)."""

    def __init__(self, role: str, message: str):
        super().__init__(message)
        self.role = role


class WorkerLost(EngineDeadError):
    """A worker process died (or stopped taking commands) under a command."""

    def __init__(self, role: str, message: str):
        super().__init__(message)
        self.role = role


class WorkerLink:
    def __init__(self, role: str, channel: Channel, process=None):
        self.role = role
        self.channel = channel
        self.process = process   # a supervisor.Worker: how its process ended, if it has
        self.hello: WorkerHello | None = None
        self.buffers: dict[str, SharedArray] = {}
        self.specs: dict[str, list] = {}   # every buffer the worker maps (for a restarted one)
        self.busy = False
        self.stashed = None      # a reply poll() took off the socket, for wait()

    def wait(self, timeout_s: float | None = None):
        """The next reply; raises WorkerLost if the worker process is gone."""
        while True:
            message, self.stashed = self.stashed or self.channel.receive(timeout_s, self.check_alive, POLL_S), None
            if message is None:
                raise EngineDeadError(f"the {self.role} worker did not answer within {timeout_s:.0f} s")
            if self.is_stale(message):
                continue
            self.busy = False
            if isinstance(message, WorkerFailed):
                if message.fatal:
                    raise EngineDeadError(message.message)
                raise WorkerError(self.role, message.message)
            return message

    def death(self) -> str | None:
        """Why this worker cannot answer any more, if its process is gone."""
        if self.process is not None:
            reason = self.process.exit_reason()
            return reason and f"the {self.role} worker (pid {self.process.pid}) {reason}"
        if self.hello is not None and not _alive(self.hello.pid):
            return f"the {self.role} worker (pid {self.hello.pid}) died"
        return None

    def check_alive(self) -> None:
        if reason := self.death():
            self.lost()
            raise WorkerLost(self.role, reason)

    def lost(self) -> None:
        """Forget the commands a dead worker will never answer."""
        self.busy, self.stashed = False, None

    def poll(self) -> bool:
        """True if a reply is waiting (without taking it); WorkerLost if none ever will."""
        while self.stashed is None and self.channel.waiting():
            message = self.channel.recv(0)
            if not self.is_stale(message):
                self.stashed = message
        if self.stashed is None:
            self.check_alive()
        return self.stashed is not None

    def discard(self) -> None:
        """Collect and drop the reply to an outstanding command, if any."""
        while self.busy:
            try:
                self.wait()
            except WorkerError:
                pass

    def is_stale(self, message) -> bool:
        """A message that answers nothing outstanding, to be dropped."""
        return False

    def stop_background(self) -> None:
        """Idle stops what a worker does between commands (an extension, a run ahead)."""
        try:
            self.send(Idle())
        except WorkerLost:         # nothing to stop
            pass
        self.busy = False          # Idle has no reply

    def send(self, message) -> None:
        """Never to a dead worker (a DEALER with no peer holds the message, and once
        full the sender, until one connects), nor to a restarted one still loading."""
        self.check_alive()
        if self.process is not None and not self.process.ready_now:
            raise WorkerLost(self.role, f"the {self.role} worker is {self.process.state}")
        self._send(message)

    def _send(self, message) -> None:
        try:
            self.channel.send(message)
        except zmq.Again:          # the send timed out ([SNDTIMEO]): it stopped reading
            self.lost()
            raise WorkerLost(self.role, self.death() or f"the {self.role} worker stopped taking commands") from None
        self.busy = True

    def attach(self, run_id: str, layout: dict[str, tuple], shared: dict[str, SharedArray] | None = None) -> None:
        """Create this worker's shared buffers and have it map them and `shared` ones (closed by whoever made them)."""
        for key, (shape, dtype) in layout.items():
            self.buffers[key] = SharedArray.create(segment_name(run_id, f"{self.role}-{key}"), shape, dtype)
        self.specs = {k: b.spec() for k, b in {**self.buffers, **(shared or {})}.items()}
        self.reattach()

    def reattach(self) -> None:
        """Have the (perhaps restarted) worker map the buffers made for it."""
        self._send(AttachBuffers(self.specs))
        reply = self.wait(60)
        assert isinstance(reply, Attached), reply

    def close(self) -> None:
        try:
            self.channel.send(Shutdown())
        finally:
            for buffer in self.buffers.values():
                buffer.close()
            self.buffers = {}


class TargetLink(WorkerLink):
    with_probs = False    # the last verify writes probability rows
    run = 0               # the last VerifyCommand's number
    ahead: tuple | None = None   # (request_id, cache, tokens still to come) of a run ahead under way
    batch: tuple = ()            # the last VerifyBatch's commands

    def start_verify(self, request_id: int, cache: int, tokens, keep: int, rows: int, sampling: Sampling,
                     borrow_cores: bool = False, ahead: int = 0) -> None:
        """Crop cache `cache` to `keep` tokens and run `tokens` after it, answering for the last `rows` positions;
        with `ahead` the target then goes on alone, a token at a time (ran_ahead)."""
        self.buffers["input"].array[:len(tokens)] = tokens
        self.with_probs = sampling.rule is Rule.UNKEYED
        self.run += 1
        self.send(VerifyCommand(request_id, keep, len(tokens), rows, sampling, borrow_cores, cache, ahead, self.run))
        if ahead > 0 and not self.with_probs:
            self.ahead = (request_id, cache, ahead)

    def finish_verify(self, rows: int) -> Verification:
        reply = self.wait()
        assert isinstance(reply, Verified), reply
        choice = self.buffers["choice"].array[:rows].copy()
        probs = self.buffers["probs"].array[:rows] if self.with_probs else None
        return Verification(choice, probs, reply.seconds)

    def start_batch(self, commands: list[VerifyCommand], tokens: list[np.ndarray], borrow_cores: bool) -> None:
        """Several requests' start_verify as one pass (VerifyBatch): command i runs tokens[i] in its own cache."""
        self.buffers["input"].array[:sum(map(len, tokens))] = np.concatenate(tokens)
        self.batch = tuple(commands)
        self.send(VerifyBatch(commands, borrow_cores))

    def finish_batch(self) -> list[Verification]:
        """Each command's verification, in order, its rows after the previous command's."""
        reply = self.wait()
        assert isinstance(reply, Verified), reply
        answers, row = [], 0
        for c in self.batch:
            unkeyed = c.sampling.rule is Rule.UNKEYED
            answers.append(Verification(self.buffers["choice"].array[row:row + c.rows].copy(),
                                        self.buffers["probs"].array[row:row + c.rows] if unkeyed else None,
                                        reply.seconds))
            row += c.rows
        return answers

    def running_ahead(self, request_id: int, cache: int) -> bool:
        """The target is decoding ahead in this request's cache (start_verify's `ahead`)."""
        return self.ahead is not None and self.ahead[:2] == (request_id, cache)

    def ran_ahead(self, context: np.ndarray) -> Verification | None:
        """The target's next token after `context`, decoded ahead (waits for it); None where the run went from
        another context (its command's guess was cut short)."""
        request_id, cache, left = self.ahead
        message = self.wait(AHEAD_TIMEOUT_S)
        assert isinstance(message, RanAhead), message
        if message.position != len(context) or message.after != int(context[-1]):
            self.ahead = None                  # the next command stops it
            return None
        self.ahead = (request_id, cache, left - 1) if left > 1 else None
        return Verification(np.array([message.token], np.int32), None, message.seconds)

    def is_stale(self, message) -> bool:
        """Tokens decoded ahead by a run that a later command (or a turn) stopped."""
        return isinstance(message, RanAhead) and (self.ahead is None or message.run != self.run)

    def _send(self, message) -> None:
        self.ahead = None                      # any command stops a run ahead: what it still sends is stale
        super()._send(message)

    def settle(self) -> None:
        """Stop a run ahead that no step will take (the end of a request)."""
        if self.ahead is not None:
            self.stop_background()

    def lost(self) -> None:
        super().lost()
        self.ahead = None

    def export_kv(self, request_id: int, cache: int, length: int) -> None:
        """Have the target write cache `cache`'s first `length` positions to the shared "kv" buffer, for the draft."""
        self.send(ExportKV(request_id, length, cache))
        reply = self.wait()
        assert isinstance(reply, KVExported), reply


class DraftLink(WorkerLink):
    def __init__(self, role: str, channel: Channel):
        super().__init__(role, channel)
        self.slot = 0
        self.command = 0
        self.extending = False   # the last window may grow after its reply (DraftExtended)
        self.with_probs = False  # the last window comes with probability rows
        self.held: dict[int, np.ndarray] = {}   # what each draft cache holds, as far as the replies tell
        self.batch: tuple = ()   # the last DraftBatch's windows and contexts

    def cache(self, cache: int) -> int:
        """The draft cache of a request in target cache `cache`: its own, unless the draft holds one for all."""
        return cache if self.hello is not None and self.hello.caches > 1 else 0

    def ready(self, cache: int, context) -> bool:
        """The request's draft cache holds its context but a lag its first window catches up in passing."""
        return self.to_prefill(cache, context, True) <= READY_LAG

    def forget(self, cache: int) -> None:
        """Its cache is to be read afresh (a request that keeps no prompt prefix)."""
        self.held.pop(self.cache(cache), None)

    def start_prefill(self, request_id: int, cache: int, context, seed: int, reuse_cache: bool, borrow_cores: bool,
                      kv_length: int = 0) -> None:
        """Bring the request's draft cache up to date with context, first taking the target's cache of kv_length
        tokens."""
        cache = self.cache(cache)
        self.buffers["context"].array[:len(context)] = self.held[cache] = np.array(context, np.int32)
        self.extending = False
        self.send(PrefillDraft(request_id, len(context), seed, reuse_cache, borrow_cores, kv_length, cache))

    def finish_prefill(self) -> float:
        reply = self.wait()
        assert isinstance(reply, Prefilled), reply
        return reply.seconds

    def to_prefill(self, cache: int, context, reuse_cache: bool) -> int:
        """Tokens a prefill of context would run: those after its common prefix with what the cache holds."""
        held = self.held.get(self.cache(cache), np.zeros(0, np.int32))
        n = min(len(held), len(context)) if reuse_cache else 0
        mismatch = np.flatnonzero(held[:n] != np.asarray(context[:n]))
        return len(context) - (int(mismatch[0]) if len(mismatch) else n)

    def start_window(self, request_id: int, cache: int, context, gamma: int, sampling: Sampling,
                     branches: BranchPlan | None = None) -> None:
        """Draft gamma tokens after context: one sequence, or the pipeline's next window as branches (BranchPlan)."""
        cache = self.cache(cache)
        self.buffers["context"].array[:len(context)] = self.held[cache] = np.array(context, np.int32)
        self.slot ^= 1   # double buffering: the pending window's rows stay readable
        self.command += 1
        self.extending = branches is not None and branches.extend_to > gamma
        self.with_probs = sampling.rule is Rule.UNKEYED
        self.send(DraftWindow(request_id, self.command, len(context), gamma, sampling, self.slot, branches, cache))

    def finish_window(self) -> Draft:
        """The draft's reply, with whatever the likeliest branch grew since."""
        reply = self.wait()
        assert isinstance(reply, Drafted), reply
        total, seconds = sum(reply.lengths), reply.seconds
        while (more := self.channel.recv(0)) is not None:
            if isinstance(more, DraftExtended) and more.command == self.command:
                total, seconds = more.total, more.seconds
        tokens = from_slot(self.buffers["tokens"].array[reply.slot], reply.lengths, total)
        probs = from_slot(self.buffers["probs"].array[reply.slot], reply.lengths, total) if self.with_probs else None
        return Draft([b.copy() for b in tokens], probs, seconds)

    def start_batch(self, windows: list[BatchWindow], contexts: list[np.ndarray], gamma: int, catch_up: int) -> None:
        """Several requests' windows as one command (DraftBatch): window i after contexts[i], in its own cache
        (a cache catching up first reads at most catch_up tokens)."""
        for window, context in zip(windows, contexts):
            self.buffers["contexts"].array[window.cache, :len(context)] = context
        self.batch = tuple(zip(windows, contexts))
        self.send(DraftBatch(windows, gamma, catch_up))

    def finish_batch(self) -> tuple[DraftedBatch, list[np.ndarray]]:
        """The draft's reply, and the tokens drafted in each window (none: still catching up)."""
        try:
            reply = self.wait()
        except WorkerError:                    # what the failed pass left in its caches is unknown
            for window, _ in self.batch:
                self.held.pop(window.cache, None)
            raise
        assert isinstance(reply, DraftedBatch), reply
        drafts = self.buffers["drafts"].array
        for (window, context), cached in zip(self.batch, reply.cached):
            self.held[window.cache] = np.array(context[:cached], np.int32)
        return reply, [drafts[w.cache, :n].copy() for (w, _), n in zip(self.batch, reply.lengths)]

    def halt(self) -> None:
        """The verdict is in: stop an extension of the last window mid-step (the native draft checks the shared "halt"
        flag between layers, others between steps) so the next command need not wait; a window's command clears it."""
        if self.extending and "halt" in self.buffers:
            self.buffers["halt"].array[0] = 1

    def is_stale(self, message) -> bool:
        """Extensions are collected by finish_window right after their reply: any met later came too late."""
        return isinstance(message, DraftExtended)

    def settle(self) -> None:
        """Stop an extension still running at a request's end, so it does not compete with what runs next."""
        if self.extending:
            self.halt()                        # mid-step, rather than after it
            self.extending = False
            self.stop_background()

    def lost(self) -> None:
        super().lost()
        self.slot, self.command, self.extending, self.held = 0, 0, False, {}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
