"""The scheduler process: owns the workers' links and shared memory, measures
the draft budget, queues requests from any number of clients and runs them
one at a time through the decoding loop.

python -m hetspec.scheduler RUN_FILE   (the run file is written by the launcher)
"""
from __future__ import annotations

import os

import numpy as np
import zmq

from hetspec.config import load_config
from hetspec.core.errors import ConfigError, EngineDeadError, EngineStartError, RequestError
from hetspec.core.pinning import pin
from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import (
    CalibrateDraft,
    CalibrateTarget,
    EngineInfo,
    Finished,
    GenerateRequest,
    InfoRequest,
    RequestFailed,
    StopEngine,
    TokensEvent,
    WorkerHello,
)
from hetspec.ipc.shm import SharedArray, segment_name
from hetspec.ipc.specs import ModelSpec
from hetspec.scheduler.acceptance_prior import AcceptancePrior
from hetspec.scheduler.bridge import BridgedDraft, check_expressible, describe_vocabularies
from hetspec.scheduler.budget import CostModel, choose_gamma, interpolate, monotone
from hetspec.scheduler.clients import Clients, Pending
from hetspec.scheduler.decoder import Capabilities, Decoder
from hetspec.scheduler.gate import memories
from hetspec.scheduler.links import DraftLink, TargetLink, WorkerError, WorkerLost
from hetspec.scheduler.requests import resolve
from hetspec.scheduler.supervisor import Crew
from hetspec.scheduler.tokenizer import Tokenizer

CALIBRATION_CONTEXT = 256
WORKER_SEND_TIMEOUT_MS = 2000   # a DEALER with no peer (a dead worker) would block a send forever
VERIFY_SIZES = [1, 2, 4, 6, 8, 10, 12, 16, 24, 32]


class Stopped(Exception):
    """The running request ends early with the tokens it has: its client cancelled it
    or went away ("cancelled"), or its deadline passed ("timeout")."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Scheduler:
    def __init__(self, run: dict):
        self.run = run
        self.config = load_config(run["config"])
        pin(self.config.server.cores)   # before zmq starts its threads, which inherit it
        self.models = {k: ModelSpec(**v) for k, v in run["models"].items()}
        self.context = zmq.Context()
        self.draft = DraftLink("draft", Channel(self.context, run["endpoints"]["draft"], bind=True))
        self.target = TargetLink("target", Channel(self.context, run["endpoints"]["target"], bind=True))
        self.crew = Crew(run, {"draft": self.draft, "target": self.target})
        self.clients = Clients(self.context, run["endpoints"]["client"], self.config.server.max_queue,
                               self.config.server.api_key)
        for link in (self.draft, self.target):
            link.channel.socket.setsockopt(zmq.SNDTIMEO, WORKER_SEND_TIMEOUT_MS)
        self.counts = self.clients.counts     # requests by how they ended
        self.info: dict = {}
        self.stopping = False
        self.parent = os.getppid()            # the launcher: if it goes, so do we
        self.kv_buffer = None                 # the target's prompt cache on its way to the draft, if handed over
        self.acceptance = AcceptancePrior()

    # ---- start-up ------------------------------------------------------------

    def start(self) -> None:
        """Start the workers and load the tokenizer while they load their models, then
        wire them up. A worker that dies while starting fails the start (no restarts)."""
        self.crew.start()
        self.tokenizer = Tokenizer(self.models["target"])
        draft_tokenizer = self._draft_tokenizer()
        timeout = self.config.server.startup_timeout_s
        hellos = {}
        for link in (self.draft, self.target):
            try:
                message = link.wait(timeout)
            except WorkerLost as lost:
                log = "\n".join(self.crew.workers[link.role].last_log_lines())
                raise EngineStartError(f"{lost} while loading its model; its last log lines:\n{log}") from None
            if isinstance(message, WorkerHello):
                link.hello = hellos[link.role] = message
                self.crew.workers[link.role].ready()
        self.n_vocab, n_draft_vocab = hellos["target"].n_vocab, hellos["draft"].n_vocab
        for role, tokenizer, n_vocab in (("target", self.tokenizer, self.n_vocab),
                                         ("draft", draft_tokenizer, n_draft_vocab)):
            if tokenizer and tokenizer.hf is not None and len(tokenizer.hf) > n_vocab:   # (bytes: a test model's)
                raise EngineStartError(f"the {role}'s tokenizer has {len(tokenizer.hf)} tokens but its model only "
                                       f"{n_vocab}: they do not belong together")
        differ = draft_tokenizer and describe_vocabularies(self.tokenizer, draft_tokenizer, self.n_vocab, n_draft_vocab)
        if differ:
            check_expressible(draft_tokenizer, self.models["draft"].file or "random")
        self.eos = set(hellos["target"].eos_token_ids) | self.tokenizer.eos_token_ids
        rows, run_id = self.config.decoding.max_gamma + 2, self.run["run_id"]
        max_tokens = self.config.server.max_context + rows
        # The draft reports a cache shape only with [draft] prompt_kv = "auto": one it
        # can take from the target when the target's has the same (a quantized copy).
        geometry = hellos["draft"].kv_geometry
        shared = {}
        if geometry and geometry == hellos["target"].kv_geometry:
            layers, heads, head_dim, _ = geometry
            self.kv_buffer = SharedArray.create(segment_name(run_id, "kv"), (2, layers, heads, max_tokens, head_dim),
                                                np.float16)
            shared = {"kv": self.kv_buffer}
        self.target.attach(run_id, {"input": ((max_tokens,), np.int32), "choice": ((rows,), np.int32),
                                    "probs": ((rows, self.n_vocab), np.float32)}, shared)
        self.draft.attach(run_id, {"context": ((max(max_tokens, self.config.draft.n_ctx),), np.int32),
                                   "tokens": ((2, rows + self.config.decoding.max_sequences), np.int32),
                                   "probs": ((2, rows + self.config.decoding.max_sequences, n_draft_vocab),
                                             np.float32)}, shared)
        self.gamma, budget, self.costs = self._budget()
        self.memories = memories(target_s=interpolate(self.costs.verify_s, 1) if self.costs else None)
        keep = self.config.decoding.keep_drafting
        # On a CPU target both workers share the memory bus: a draft that never
        # rests slows verification more than its extra tokens gain (docs/performance.md).
        keep_drafting = hellos["target"].device.startswith("cuda") if keep == "auto" else keep
        self.caps = Capabilities(
            max_window=self.config.decoding.max_gamma, max_sequences=self.config.decoding.max_sequences,
            borrow_cores=self.config.target.prefill_borrows_draft_cores,
            draft_borrows_cores=self.config.draft.prefill_borrows_target_cores and hellos["draft"].prefill_threads,
            keep_drafting=keep_drafting, kv_handover=self.kv_buffer is not None)
        self.drafter = BridgedDraft(self.draft, self.tokenizer, draft_tokenizer, self.caps.max_window,
                                    self.config.draft.n_ctx, self.n_vocab) if differ else self.draft
        self.info = {
            "pid": os.getpid(), "endpoint": self.clients.endpoint, "gamma": self.gamma, "budget": budget,
            "keep_drafting": keep_drafting, "prompt_kv": "target" if self.caps.kv_handover else "own",
            "n_vocab": self.n_vocab, "vocabulary": _vocabulary(differ, self.n_vocab, n_draft_vocab),
            "config": _redacted(self.config.to_dict()),
            "draft": _worker_info(hellos["draft"]), "target": _worker_info(hellos["target"]),
        }

    def _draft_tokenizer(self) -> Tokenizer | None:
        """The draft's tokenizer, when the draft is another model than the target (its
        vocabulary may then differ); None when it is the target's own file."""
        draft, target = self.models["draft"], self.models["target"]
        if (draft.kind, draft.file, draft.random) == (target.kind, target.file, target.random):
            return None
        try:
            return Tokenizer(draft)
        except ConfigError as exc:
            raise EngineStartError(f"the draft's tokenizer: {exc} (a draft that is another model than the target "
                                   "needs its own tokenizer files, even if it shares the target's vocabulary)") from None

    def _budget(self) -> tuple[int, dict, CostModel | None]:
        """gamma = "auto": time both workers at once (as they will run) and balance them."""
        decoding = self.config.decoding
        if decoding.gamma != "auto":
            return decoding.gamma, {"source": "config"}, None
        sizes = [n for n in VERIFY_SIZES if n <= decoding.max_gamma + 1]
        context = min(CALIBRATION_CONTEXT, self.config.server.max_context // 2)
        self.draft.send(CalibrateDraft(context, 8, repeats=6))
        self.target.send(CalibrateTarget(context, sizes))
        verify_s = monotone(dict(zip(sizes, self.target.wait().seconds)))
        draft_s = self.draft.wait().seconds_per_token
        gamma = choose_gamma(draft_s, verify_s, decoding.max_gamma)
        return gamma, {"source": "measured", "context": context, "draft_s_per_token": draft_s,
                       "verify_s": {str(k): v for k, v in verify_s.items()}}, CostModel(draft_s, verify_s)

    # ---- serving ---------------------------------------------------------------

    def serve(self) -> None:
        while not self.stopping and os.getppid() == self.parent:   # an orphan stops
            self.crew.check()
            self._read_clients(timeout_ms=0 if self._can_run() else 100)
            self.clients.expire()
            if self._can_run() and (pending := self.clients.next()):
                try:
                    self._decode(pending)
                finally:
                    self.clients.done()
        self.clients.refuse_all("the engine stopped")

    def _can_run(self) -> bool:
        """A queued request runs once the target is up (or given up: then it is
        answered at once); while the target restarts, requests wait."""
        return bool(self.clients.queue) and self.crew.workers["target"].state != "starting"

    def _read_clients(self, timeout_ms: int) -> None:
        for identity, message in self.clients.read(timeout_ms):
            if isinstance(message, InfoRequest):
                self.clients.send(identity, EngineInfo(self._live_info()))
            elif isinstance(message, StopEngine):
                self.stopping = True
            else:
                self.clients.send(identity, RequestFailed(-1, "request", f"unexpected {type(message).__name__}"))

    def _live_info(self) -> dict:
        """The start-up info, with what changes: the queue, the requests so far, the
        workers (restarts, state), and why the engine cannot serve, if it cannot."""
        workers = self.crew.info()
        for role in ("draft", "target"):
            self.info[role]["pid"] = workers[role]["pid"]
        return {**self.info, "running": int(self.clients.running is not None), "waiting": len(self.clients.queue),
                "requests": dict(self.counts), "workers": workers, "restarts": self.crew.restarts(),
                "dead": self._dead()}

    def _dead(self) -> str | None:
        """Why no request can be served, if none can: the target was given up."""
        target = self.crew.workers["target"]
        return target.failure if target.state == "failed" else None

    def _decode(self, pending: Pending) -> None:
        identity, rid = pending.identity, pending.message.request_id
        if dead := self._dead():
            self.clients.send(identity, RequestFailed(rid, "dead", dead))
            return
        try:
            decoder = self._decoder(pending.message)
            stats = decoder.run(lambda ids, text: self._emit(identity, TokensEvent(rid, ids, text)))
        except RequestError as exc:
            self.counts["refused"] += 1
            self.clients.send(identity, RequestFailed(rid, "request", str(exc)))
        except WorkerLost as lost:         # the target died (a lost draft never gets here: Decoder.run)
            self._drain()
            if decoder.out.length == decoder.out.n_prompt and not pending.retried:
                pending.retried = True     # nothing was streamed: it runs again, first, once the target is back
                self.clients.queue.appendleft(pending)
                return
            self.counts["aborted"] += 1
            self.clients.send(identity, RequestFailed(rid, "aborted", f"{lost} while this request ran; the engine "
                                                      "is restarting it and keeps serving: send the request again"))
        except EngineDeadError as exc:     # the engine is stopping
            self.clients.send(identity, RequestFailed(rid, "dead", str(exc)))
        except WorkerError as exc:
            self._drain()
            self.clients.send(identity, RequestFailed(rid, "request", str(exc)))
        except Stopped as stop:            # both workers may be mid-round: collect their replies first
            self.counts[stop.reason] += 1
            self._drain()
            out = decoder.out
            out.cancel(stop.reason)
            self.clients.send(identity, Finished(rid, out.new_ids, out.text, out.finish_reason,
                                                 decoder.stats.report(decoder.request, out)))
        else:
            self.counts["completed"] += 1
            self.acceptance.learn(decoder.request, stats)
            out = decoder.out
            self.clients.send(identity, Finished(rid, out.new_ids, out.text, out.finish_reason,
                                                 stats.report(decoder.request, out)))

    def _emit(self, identity: bytes, event: TokensEvent) -> None:
        """Stream a round's tokens (if any); restart a worker that died, and answer or
        queue whatever clients sent meanwhile; stop the request if it must stop."""
        if (event.token_ids or event.text) and not self.clients.send(identity, event):
            raise Stopped("cancelled")     # its client has gone
        self.crew.check()
        self._read_clients(timeout_ms=0)
        if self.stopping or os.getppid() != self.parent:   # asked to stop, or orphaned: do not finish first
            raise EngineDeadError("the engine was stopped while this request was running")
        if reason := self.clients.must_stop():
            raise Stopped(reason)

    def _decoder(self, message: GenerateRequest) -> Decoder:
        request, output = resolve(message, self)
        without_draft = None if request.params.mode == "target" else self.crew.unavailable("draft")
        return Decoder(request, self.caps, self.drafter, self.target, output, self.costs, without_draft,
                       self.memories.get(request.params.mode))

    def _drain(self) -> None:
        """After a failed or stopped round, collect both workers' outstanding replies."""
        for link in (self.draft, self.target):
            try:
                link.discard()
            except WorkerLost:
                pass
        self.draft.settle()

    def close(self) -> None:
        """Tell both workers to leave and wait for them (a dead one is not waited on)."""
        for link in (self.draft, self.target):
            try:
                link.channel.socket.setsockopt(zmq.SNDTIMEO, 0)   # never wait on a dead worker
                link.close()
            except zmq.ZMQError:
                pass
        for worker in self.crew.workers.values():
            worker.stop(grace_s=5)
        if self.kv_buffer is not None:
            self.kv_buffer.close()
        self.draft.channel.close()
        self.target.channel.close()
        self.clients.close()
        self.context.term()


def _redacted(config: dict) -> dict:
    """The config as clients may see it: never the API key."""
    if config["server"].get("api_key"):
        config["server"]["api_key"] = "(set)"
    return config


def _vocabulary(differ: str | None, n_target: int, n_draft: int) -> dict:
    """How the draft's tokens become the target's (bridge.py)."""
    if not differ:
        return {"shared": True, "target": n_target, "draft": n_draft,
                "bridge": "none: the draft and the target use the same tokens"}
    return {"shared": False, "target": n_target, "draft": n_draft,
            "bridge": f"text: {differ}; committed tokens reach the draft as text in its own tokens, and its "
                      "windows reach the target as text in the target's tokens (sampling accepts each "
                      "proposed token with the target's probability)"}


def _worker_info(hello: WorkerHello) -> dict:
    return {"pid": hello.pid, "device": hello.device, "cores": hello.cores, "threads": hello.threads,
            "load_s": round(hello.load_s, 3), "kernels": hello.kernels}
