"""The scheduler process: owns the workers' links and shared memory, measures
the draft budget, queues requests from any number of clients and runs them
one at a time through the decoding loop.

python -m hetspec.scheduler RUN_FILE   (the run file is written by the launcher)
"""
from __future__ import annotations

import os
import secrets
from collections import Counter, deque

import numpy as np
import zmq

from hetspec.config import load_config
from hetspec.core.errors import EngineDeadError, EngineStartError, RequestError
from hetspec.core.pinning import pin
from hetspec.ipc.channel import Channel, Router
from hetspec.ipc.messages import (
    CalibrateDraft,
    CalibrateTarget,
    CancelRequest,
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
from hetspec.scheduler.budget import CostModel, choose_gamma, monotone
from hetspec.scheduler.decoder import Capabilities, Decoder
from hetspec.scheduler.links import DraftLink, TargetLink, WorkerError
from hetspec.scheduler.requests import resolve
from hetspec.scheduler.tokenizer import Tokenizer

CALIBRATION_CONTEXT = 256
WORKER_SEND_TIMEOUT_MS = 2000   # a DEALER with no peer (a dead worker) would block a send forever
MAX_EARLY_CANCELS = 1024
VERIFY_SIZES = [1, 2, 4, 6, 8, 10, 12, 16, 24, 32]


class Cancelled(Exception):
    """The running request was cancelled by its client."""


class Scheduler:
    def __init__(self, run: dict):
        self.run = run
        self.config = load_config(run["config"])
        pin(self.config.server.cores)   # before zmq starts its threads, which inherit it
        self.models = {k: ModelSpec(**v) for k, v in run["models"].items()}
        self.context = zmq.Context()
        self.draft = DraftLink("draft", Channel(self.context, run["endpoints"]["draft"], bind=True))
        self.target = TargetLink("target", Channel(self.context, run["endpoints"]["target"], bind=True))
        self.clients = Router(self.context, run["endpoints"]["client"])
        for link in (self.draft, self.target):
            link.channel.socket.setsockopt(zmq.SNDTIMEO, WORKER_SEND_TIMEOUT_MS)
        self.queue: deque = deque()
        self.running: int | None = None    # the request being decoded
        self.cancelled: set[int] = set()   # ... asked to stop (CancelRequest)
        self.counts = Counter()            # requests by outcome: completed, cancelled, failed
        self.info: dict = {}
        self.dead: str | None = None       # why the engine can no longer serve
        self.stopping = False
        self.parent = os.getppid()         # the launcher: if it goes, so do we
        self.kv_buffer = None              # the target's prompt cache on its way to the draft, if handed over
        self.acceptance = AcceptancePrior()

    # ---- start-up ------------------------------------------------------------

    def start(self) -> None:
        """Load the tokenizer while the workers load their models, then wire them up."""
        self.tokenizer = Tokenizer(self.models["target"])
        timeout = self.config.server.startup_timeout_s
        hellos = {}
        for link in (self.draft, self.target):
            message = link.wait(timeout)
            if isinstance(message, WorkerHello):
                link.hello = hellos[link.role] = message
        if hellos["draft"].n_vocab != hellos["target"].n_vocab:
            raise EngineStartError(
                f"draft and target have different vocabularies: the draft has {hellos['draft'].n_vocab} "
                f"tokens, the target {hellos['target'].n_vocab}; speculative decoding needs a shared vocabulary")
        self.n_vocab = hellos["target"].n_vocab
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
        self.draft.attach(run_id, {"context": ((max_tokens,), np.int32),
                                   "tokens": ((2, rows + self.config.decoding.max_sequences), np.int32),
                                   "probs": ((2, rows + self.config.decoding.max_sequences, self.n_vocab),
                                             np.float32)}, shared)
        self.gamma, budget, self.costs = self._budget()
        keep = self.config.decoding.keep_drafting
        # On a CPU target both workers share the memory bus: a draft that never
        # rests slows verification more than its extra tokens gain (docs/performance.md).
        keep_drafting = hellos["target"].device.startswith("cuda") if keep == "auto" else keep
        self.caps = Capabilities(
            max_window=self.config.decoding.max_gamma, max_sequences=self.config.decoding.max_sequences,
            borrow_cores=self.config.target.prefill_borrows_draft_cores,
            draft_borrows_cores=self.config.draft.prefill_borrows_target_cores and hellos["draft"].prefill_threads,
            keep_drafting=keep_drafting, kv_handover=self.kv_buffer is not None)
        self.info = {
            "pid": os.getpid(), "endpoint": self.clients.endpoint, "gamma": self.gamma, "budget": budget,
            "keep_drafting": keep_drafting, "prompt_kv": "target" if self.caps.kv_handover else "own",
            "n_vocab": self.n_vocab, "config": _redacted(self.config.to_dict()),
            "draft": _worker_info(hellos["draft"]), "target": _worker_info(hellos["target"]),
        }

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
            self._read_clients(timeout_ms=100 if not self.queue else 0)
            if self.queue:
                identity, request = self.queue.popleft()
                self._run_request(identity, request)
        while self.queue:                                       # never leave a client waiting
            identity, request = self.queue.popleft()
            self.clients.send(identity, RequestFailed(request.request_id, "dead", "the engine stopped"))

    def _read_clients(self, timeout_ms: int) -> None:
        if not self.clients.socket.poll(timeout_ms):
            return
        while (item := self.clients.recv_nowait()) is not None:
            identity, message = item
            if isinstance(message, ValueError):
                self.clients.send(identity, RequestFailed(-1, "request", f"malformed message: {message}"))
            elif not self._authorized(message):
                rid = getattr(message, "request_id", -1)
                self.clients.send(identity, RequestFailed(rid, "auth", "this engine needs its API key (the token)"))
            elif isinstance(message, InfoRequest):
                self.clients.send(identity, EngineInfo(self._live_info()))
            elif isinstance(message, StopEngine):
                self.stopping = True
            elif isinstance(message, GenerateRequest) and message.request_id in self.cancelled:
                self.cancelled.discard(message.request_id)    # cancelled before it arrived
                self._send_cancelled(identity, message.request_id)
            elif isinstance(message, GenerateRequest) and self._waiting_after_one_more() > self.config.server.max_queue:
                self.counts["busy"] += 1
                self.clients.send(identity, RequestFailed(message.request_id, "busy", "the engine is busy: "
                                                          f"{len(self.queue)} requests are waiting ([server] max_queue)"))
            elif isinstance(message, GenerateRequest):
                self.queue.append((identity, message))
            elif isinstance(message, CancelRequest):
                self._cancel(message.request_id)
            else:
                self.clients.send(identity, RequestFailed(-1, "request", f"unexpected {type(message).__name__}"))

    def _live_info(self) -> dict:
        """The start-up info, with what changes: the queue, the requests so far, and why
        the engine cannot serve if a worker has gone."""
        return {**self.info, "running": int(self.running is not None), "waiting": len(self.queue),
                "requests": dict(self.counts), "dead": self.dead or self._dead_worker()}

    def _waiting_after_one_more(self) -> int:
        """Requests that would wait behind a running one if one more came (when idle, the
        first in the queue runs at once)."""
        return len(self.queue) + (self.running is not None)

    def _authorized(self, message) -> bool:
        key = self.config.server.api_key
        return not key or secrets.compare_digest(str(getattr(message, "token", "")).encode(), key.encode())

    def _cancel(self, rid: int) -> None:
        """A queued request ends at once, the running one at its next round (_emit), and
        one not seen yet (its cancel overtook it on another socket) as soon as it arrives."""
        for identity, request in list(self.queue):
            if request.request_id == rid:
                self.queue.remove((identity, request))
                self._send_cancelled(identity, rid)
                return
        if len(self.cancelled) > MAX_EARLY_CANCELS:   # ids of requests that finished before their cancel
            self.cancelled.clear()
        self.cancelled.add(rid)

    def _send_cancelled(self, identity: bytes, rid: int) -> None:
        self.counts["cancelled"] += 1
        self.clients.send(identity, Finished(rid, [], "", "cancelled", {"finish_reason": "cancelled", "new_tokens": 0}))

    def _run_request(self, identity: bytes, request: GenerateRequest) -> None:
        rid = request.request_id
        self.running = rid
        try:
            self._decode(identity, request)
        finally:
            self.running = None
            self.cancelled.discard(rid)     # a cancel that came too late is forgotten

    def _decode(self, identity: bytes, request: GenerateRequest) -> None:
        rid = request.request_id
        if not self.dead:
            self.dead = self._dead_worker()
        if self.dead:
            self.clients.send(identity, RequestFailed(rid, "dead", self.dead))
            return
        try:
            decoder = self._decoder(request)
            stats = decoder.run(lambda ids, text: self._emit(identity, TokensEvent(rid, ids, text)))
        except RequestError as exc:
            self.counts["refused"] += 1
            self.clients.send(identity, RequestFailed(rid, "request", str(exc)))
        except EngineDeadError as exc:
            self.dead = str(exc)
            self.clients.send(identity, RequestFailed(rid, "dead", self.dead))
        except WorkerError as exc:
            self._drain()
            self.clients.send(identity, RequestFailed(rid, "request", str(exc)))
        except zmq.Again:                  # a send to a worker timed out: it has gone
            self.dead = self._dead_worker() or "a worker stopped accepting commands"
            self.clients.send(identity, RequestFailed(rid, "dead", self.dead))
        except Cancelled:                  # both workers may be mid-round: collect their replies first
            self.counts["cancelled"] += 1
            self._drain()
            self.draft.settle()
            out = decoder.out
            out.cancel()
            self.clients.send(identity, Finished(rid, out.new_ids, out.text, out.finish_reason,
                                                 decoder.stats.report(decoder.request, out)))
        else:
            self.counts["completed"] += 1
            self.acceptance.learn(decoder.request, stats)
            out = decoder.out
            self.clients.send(identity, Finished(rid, out.new_ids, out.text, out.finish_reason,
                                                 stats.report(decoder.request, out)))

    def _emit(self, identity: bytes, event: TokensEvent) -> None:
        """Stream a round's tokens (if any), and answer or queue whatever clients sent meanwhile."""
        if event.token_ids or event.text:
            self.clients.send(identity, event)
        self._read_clients(timeout_ms=0)
        if self.stopping or os.getppid() != self.parent:   # asked to stop, or orphaned: do not finish first
            raise EngineDeadError("the engine was stopped while this request was running")
        if self.running in self.cancelled:
            raise Cancelled

    def _decoder(self, message: GenerateRequest) -> Decoder:
        request, output = resolve(message, self)
        return Decoder(request, self.caps, self.draft, self.target, output, self.costs)

    def _dead_worker(self) -> str | None:
        """Why the engine cannot serve, if a worker process has gone (checked before
        sending it anything: a send to a departed worker would never return)."""
        return self.draft.death() or self.target.death()

    def _drain(self) -> None:
        """After a failed command, collect the other worker's outstanding reply."""
        for link in (self.draft, self.target):
            while link.busy:
                try:
                    link.wait()
                except WorkerError:
                    pass

    def close(self) -> None:
        for link in (self.draft, self.target):
            try:
                link.channel.socket.setsockopt(zmq.SNDTIMEO, 0)   # never wait on a dead worker
                link.close()
            except zmq.ZMQError:
                pass
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


def _worker_info(hello: WorkerHello) -> dict:
    return {"pid": hello.pid, "device": hello.device, "cores": hello.cores, "threads": hello.threads,
            "load_s": round(hello.load_s, 3), "kernels": hello.kernels}
