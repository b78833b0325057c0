"""The scheduler's loop: between steps it reads clients, ends what must end and admits
requests; each step is one target pass for every running request (batch.py)."""
from __future__ import annotations

import os
import time
import traceback

import zmq

from hetspec.config import load_config
from hetspec.core.errors import EngineDeadError, HetspecError, RequestError
from hetspec.core.pinning import pin
from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import EngineInfo, Finished, InfoRequest, RequestFailed, StopEngine, TokensEvent
from hetspec.ipc.specs import RunSpec
from hetspec.scheduler import startup
from hetspec.scheduler.batch import Batch, Drafts
from hetspec.scheduler.clients import Clients, Pending
from hetspec.scheduler.decoding.acceptance_prior import AcceptancePrior
from hetspec.scheduler.decoding.bridge import BridgedDraft
from hetspec.scheduler.decoding.decoder import Decoder
from hetspec.scheduler.decoding.gate import memories
from hetspec.scheduler.decoding.links import DraftLink, TargetLink, WorkerLost
from hetspec.scheduler.decoding.round import Part
from hetspec.scheduler.resolve import Resolver
from hetspec.scheduler.slots import Slots
from hetspec.scheduler.supervisor import Crew, State
from hetspec.scheduler.tokenizer import Tokenizer

WORKER_SEND_TIMEOUT_MS = 2000   # a DEALER with no peer (a dead worker) would block a send forever
MAX_LOOP_FAULTS = 20            # faults in a row outside any request before the scheduler gives up


class Stopped(Exception):
    """A request ends early with the tokens it has: its client cancelled it or went
    away ("cancelled"), or its deadline passed ("timeout")."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Scheduler:
    """`draft` is what a request drafts with: draft_link, or a BridgedDraft over it."""

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.config = load_config(spec.config)
        pin(self.config.server.cores)   # before zmq starts its threads, which inherit it
        self.context = zmq.Context()
        self.draft_link = DraftLink("draft", Channel(self.context, spec.endpoints.draft, bind=True))
        self.target = TargetLink("target", Channel(self.context, spec.endpoints.target, bind=True))
        self.crew = Crew(spec, {"draft": self.draft_link, "target": self.target})
        server = self.config.server
        self.clients = Clients(self.context, spec.endpoints.client, server.max_queue, server.api_key)
        self.slots: Slots | None = None       # once the target says how many requests it holds (start)
        for link in (self.draft_link, self.target):
            link.channel.socket.setsockopt(zmq.SNDTIMEO, WORKER_SEND_TIMEOUT_MS)
        self.counts = self.clients.counts     # requests by how they ended
        self.info: dict = {}
        self.stopping = False
        self.parent = os.getppid()            # the launcher: if it goes, so do we
        self.kv_buffer = None                 # the target's prompt cache on its way to the draft, if handed over
        self.acceptance = AcceptancePrior()

    def start(self) -> None:
        """Start the workers, load the tokenizers while they load, then wire them up (startup.py)."""
        spec, links = self.spec, (self.draft_link, self.target)
        self.crew.start()
        tokenizer = Tokenizer(spec.target_model)
        draft_tokenizer = startup.draft_tokenizer(spec.draft_model, spec.target_model, tokenizer)
        hellos = startup.wait_for_workers(self.crew, links, self.config.server.startup_timeout_s)
        self.config = startup.with_running(self.config, hellos["target"], self.crew.workers["target"])
        self.slots = Slots(self.config.server.max_running, self.config.server.turn_s)
        differ = startup.check_vocabularies(tokenizer, draft_tokenizer, hellos, spec.draft_model)
        self.kv_buffer = startup.attach_buffers(self.config, spec.run_id, *links, hellos)
        gamma, budget, self.costs = startup.calibrate(self.config, *links)
        alone, alone_pace, batch = startup.borrows_cores(self.config, self.target, hellos["target"].device)
        self.caps = startup.capabilities(self.config, hellos, kv_handover=self.kv_buffer is not None,
                                         alone_borrows=alone, batch_borrows=batch, differ=differ)
        if self.costs:      # the target alone's token, which speculation must beat: on both workers' cores
            self.costs.alone_pace = alone_pace   # where it takes them
        self.memories = memories(target_s=self.costs.alone_s() if self.costs else None)
        self.draft = BridgedDraft(self.draft_link, tokenizer, draft_tokenizer, self.caps.max_gamma,
                                  self.config.draft.n_ctx, hellos["target"].n_vocab) if differ else self.draft_link
        self.resolver = Resolver(tokenizer, hellos["target"].n_vocab,
                                 frozenset(hellos["target"].eos_token_ids) | tokenizer.eos_token_ids, gamma,
                                 measured=self.costs is not None, cross_vocab=bool(differ),
                                 decoding=self.config.decoding, server=self.config.server, acceptance=self.acceptance)
        server = self.config.server
        drafts = Drafts(self.draft_link, self.costs, self.caps.max_gamma,
                        lambda: self.crew.unavailable("draft") is None, self.caps.batch_drafts)
        self.batch = Batch(self.target, min(server.batch_tokens, server.max_context), startup.answer_rows(self.config),
                           drafts)
        self.info = startup.describe(self.config, self.clients.endpoint, gamma, budget, self.caps, differ, hellos, spec)

    # ---- serving ---------------------------------------------------------------

    def serve(self) -> None:
        """Until asked to stop, or orphaned. A fault outside any request is logged; MAX_LOOP_FAULTS
        in a row end the process (its launcher starts it again)."""
        faults = 0
        while not self.stopping and os.getppid() == self.parent:
            try:
                self._step()
                faults = 0
            except Exception:   # outside any request: logged, and the loop goes on
                traceback.print_exc()
                faults += 1
                if faults >= MAX_LOOP_FAULTS:
                    raise
                time.sleep(0.1)
        self.clients.refuse_all([d.client for d in self.slots.running] if self.slots else [], "the engine stopped")

    def _step(self) -> None:
        """Between steps: workers checked, clients read, requests ended and admitted; then a step."""
        self.crew.check()
        self._read_clients(timeout_ms=0 if self._can_run() else 100)
        self._sweep()
        self._admit()
        if self._target_up() and self.slots.running:
            self._run(self._plan())

    def _can_run(self) -> bool:
        """Requests wait while the target restarts (given up, they are answered at once)."""
        return bool(self.clients.queue or self.slots.running) and self._target_up()

    def _target_up(self) -> bool:
        return self.crew.workers["target"].state is not State.STARTING

    def _read_clients(self, timeout_ms: int) -> None:
        for identity, message in self.clients.read(timeout_ms, len(self.slots.running)):
            try:
                if isinstance(message, InfoRequest):
                    self.clients.send(identity, EngineInfo(self._live_info()))
                elif isinstance(message, StopEngine):
                    self.stopping = True
                else:
                    self.clients.send(identity, RequestFailed(-1, "request", f"unexpected {type(message).__name__}"))
            except Exception as exc:  # noqa: BLE001 - this message's fault boundary
                traceback.print_exc()
                self.clients.send(identity, RequestFailed(-1, "internal", _internal(exc)))

    def _live_info(self) -> dict:
        """The start-up info, with what changes: the queue, requests, workers, and why it cannot serve."""
        workers = self.crew.info()
        for role in ("draft", "target"):
            self.info[role]["pid"] = workers[role]["pid"]
        return {**self.info, "running": len(self.slots.running), "batch": self.batch.size,
                "waiting": len(self.clients.queue),
                "requests": dict(self.counts), "workers": workers, "restarts": self.crew.restarts(),
                "dead": self._dead()}

    def _dead(self) -> str | None:
        """Why no request can be served (the target was given up), if none can."""
        target = self.crew.workers["target"]
        return target.failure if target.state is State.FAILED else None

    # ---- admission, then a step (batch.py) ---------------------------------------------

    def _admit(self) -> None:
        """Queued requests join the running ones while there is room."""
        while self.slots.may_admit() and self._target_up() and (pending := self.clients.admit()):
            if dead := self._dead():
                self.clients.done(pending)
                self.clients.send(pending.identity, RequestFailed(pending.id, "dead", dead))
                continue
            try:
                self.slots.admit(lambda cache, p=pending: self._decoder(p, cache))
            except RequestError as exc:
                self.counts["refused"] += 1
                self._fail(pending, "request", str(exc))
            except Exception as exc:  # noqa: BLE001 - this request's fault boundary
                traceback.print_exc()
                self.counts["failed"] += 1
                self._fail(pending, "internal", _internal(exc))

    def _decoder(self, pending: Pending, cache: int) -> Decoder:
        request, output = self.resolver.resolve(pending)
        without_draft = self.crew.unavailable("draft") if request.params.mode.drafts else None
        return Decoder(request, self.caps, self.draft, self.target, output, self.costs, without_draft,
                       self.memories.get(request.params.mode), cache, pending, self._target_starts())

    def _plan(self) -> list[Part]:
        """Each running request's part in the next step, once its cache is known to be in the target."""
        running = self.slots.running
        try:
            for decoder in running:
                self._check_cache(decoder)
        except WorkerLost as lost:
            self._drain()
            self._target_lost(lost)
            return []
        if len(running) == 1:
            if self.slots.last is not running[0]:
                self.batch.drafts.settle()     # a new turn: a batch's draft caches caught up in the background
            self.slots.begin(running[0])
        else:
            self.slots.batching()
        return self.batch.plan(running, self._end)

    def _run(self, parts: list[Part]) -> None:
        """Start the step, stream the last step's tokens while the workers compute, finish,
        commit. Each request has its own fault boundary."""
        if not parts:                          # (every part failed as it was planned)
            return
        running = [p.decoder for p in parts]
        reading = [r.out.length == r.out.n_prompt for r in running]
        try:
            self.batch.start(parts, borrow_cores=self.caps.batch_borrows_cores and not self.draft_link.busy)
        except Exception as exc:  # noqa: BLE001 - before the pass: every request ends as the first did
            for decoder in running:
                self._end(decoder, exc)
            return
        gone = [not self._send_round(decoder) for decoder in running]
        self.crew.check()
        self._read_clients(timeout_ms=0)
        try:
            verdicts = self.batch.finish(parts)
        except WorkerLost as lost:
            self._drain()
            self._target_lost(lost)
            return
        except Exception as exc:  # noqa: BLE001 - the worker dropped every cache of the pass (WorkerError)
            for decoder in running:
                self._end(decoder, exc)
            return
        for part, verdict, client_gone, first in zip(parts, verdicts, gone, reading):
            try:
                self.batch.commit(part, verdict)
                self._after_step(part.decoder, client_gone, first)
            except Exception as exc:  # noqa: BLE001 - this request's fault boundary
                self._end(part.decoder, exc)

    def _after_step(self, decoder: Decoder, client_gone: bool, first: bool) -> None:
        """A request ends if it is done or must stop; its first token goes out at once."""
        if self.stopping or os.getppid() != self.parent:
            raise EngineDeadError("the engine was stopped while this request was running")
        if reason := "cancelled" if client_gone else self.clients.must_stop(decoder.client):
            raise Stopped(reason)
        if decoder.out.done:
            self._completed(decoder)
        elif first and not self._send_round(decoder):
            raise Stopped("cancelled")

    def _send_round(self, decoder: Decoder) -> bool:
        """A request's tokens since its last step, to its client; False if it has gone."""
        ids, text = decoder.out.take_round()
        return not (ids or text) or self.clients.send(decoder.client.identity,
                                                      TokensEvent(decoder.client.id, ids, text))

    def _check_cache(self, decoder: Decoder) -> None:
        if decoder.target_starts != self._target_starts():
            raise WorkerLost("target", "the target worker was restarted while this request waited for its "
                                       "turn (its cache went with it)")

    def _completed(self, decoder: Decoder) -> None:
        self.counts["completed"] += 1
        self.acceptance.learn(decoder.request, decoder.stats)
        self._finished(decoder)
        self._retire(decoder)

    def _end(self, decoder: Decoder, exc: Exception) -> None:
        """One request's fault boundary: whatever it raised ends it alone, with an answer."""
        pending, out = decoder.client, decoder.out
        if isinstance(exc, Stopped):       # both workers may be mid-round: collect their replies first
            self._drain()
            self.counts[exc.reason] += 1
            out.cancel(exc.reason)
            self._finished(decoder)
        elif isinstance(exc, WorkerLost):  # the target died (a lost draft never gets here: Decoder.without_draft)
            self._drain()
            self._target_lost(exc)
            return
        elif isinstance(exc, EngineDeadError):   # the engine is stopping
            self.clients.send(pending.identity, RequestFailed(pending.id, "dead", str(exc)))
        elif isinstance(exc, RequestError):
            self._drain()
            self.counts["refused"] += 1
            self.clients.send(pending.identity, RequestFailed(pending.id, "request", str(exc)))
        else:                              # a bug, a worker's failure
            traceback.print_exception(exc)
            self._drain()
            self.counts["failed"] += 1
            self.clients.send(pending.identity, RequestFailed(pending.id, "internal", _internal(exc)))
        self._retire(decoder)

    def _sweep(self) -> None:
        """Cancelled or timed-out requests end now, with the tokens they have."""
        self.clients.expire()
        for decoder in list(self.slots.running):
            if reason := self.clients.must_stop(decoder.client):
                self._end(decoder, Stopped(reason))

    def _target_lost(self, lost: WorkerLost) -> None:
        """Every running request's cache died with the target: one with no token yet runs again
        (once), first; the others are aborted."""
        for decoder in sorted(self.slots.running, key=lambda r: r.client.arrived, reverse=True):
            pending, out = decoder.client, decoder.out
            self._retire(decoder)
            if out.length == out.n_prompt and not pending.retried:
                pending.retried = True
                self.clients.queue.appendleft(pending)
            else:
                self.counts["aborted"] += 1
                self.clients.send(pending.identity, RequestFailed(pending.id, "aborted", f"{lost} while this request "
                                                                  "ran; the engine is restarting it and keeps "
                                                                  "serving: send the request again"))

    def _finished(self, decoder: Decoder) -> None:
        """What was not streamed yet (text held back for a stop string), then the whole result."""
        pending, out = decoder.client, decoder.out
        ids, text = out.take_round()
        if ids or text:
            self.clients.send(pending.identity, TokensEvent(pending.id, ids, text))
        self.clients.send(pending.identity, Finished(pending.id, out.new_ids, out.text, out.finish_reason,
                                                     decoder.stats.report(decoder.request, out)))

    def _fail(self, pending: Pending, kind: str, message: str) -> None:
        self.clients.done(pending)
        self.clients.send(pending.identity, RequestFailed(pending.id, kind, message))

    def _retire(self, decoder: Decoder) -> None:
        self.slots.remove(decoder)
        self.clients.done(decoder.client)

    def _target_starts(self) -> int:
        return self.crew.workers["target"].restarts

    def _drain(self) -> None:
        """After a failed or stopped round, collect both workers' outstanding replies."""
        for link in (self.draft_link, self.target):
            try:
                link.discard()
            except HetspecError:           # lost, or failed for good: nothing more will come
                pass
            link.settle()

    def close(self) -> None:
        """Tell both workers to leave and wait for them (a dead one is not waited on)."""
        for link in (self.draft_link, self.target):
            try:
                link.channel.socket.setsockopt(zmq.SNDTIMEO, 0)   # never wait on a dead worker
                link.close()
            except zmq.ZMQError:
                pass
        for worker in self.crew.workers.values():
            worker.stop(grace_s=5)
        if self.kv_buffer is not None:
            self.kv_buffer.close()
        self.draft_link.channel.close()
        self.target.channel.close()
        self.clients.close()
        self.context.term()


def _internal(exc: Exception) -> str:
    return (f"the engine failed on this request ({type(exc).__name__}: {exc}); it keeps serving, and the "
            "scheduler's log has the traceback")
