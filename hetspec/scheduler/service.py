"""The scheduler process: owns the workers' links and shared memory, measures
the draft budget, queues requests from any number of clients and runs them
one at a time through the decoding loop.

python -m hetspec.scheduler RUN_FILE   (the run file is written by the launcher)
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections import deque

import numpy as np
import zmq

from hetspec.config import load_config
from hetspec.core.errors import EngineDeadError, EngineStartError, HetspecError, RequestError
from hetspec.core.params import SamplingParams, check_prompt
from hetspec.core.pinning import pin
from hetspec.ipc.channel import Channel, Router
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
from hetspec.scheduler.budget import CostModel, choose_gamma, monotone
from hetspec.scheduler.decoder import Capabilities, Decoder, Request
from hetspec.scheduler.links import DraftLink, TargetLink, WorkerError
from hetspec.scheduler.output import Output
from hetspec.scheduler.tokenizer import Tokenizer

CALIBRATION_CONTEXT = 256
WORKER_SEND_TIMEOUT_MS = 2000   # a DEALER with no peer (a dead worker) would block a send forever
VERIFY_SIZES = [1, 2, 4, 6, 8, 10, 12, 16, 24, 32]


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
            "n_vocab": self.n_vocab, "config": self.config.to_dict(),
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
            elif isinstance(message, InfoRequest):
                self.clients.send(identity, EngineInfo(self.info))
            elif isinstance(message, StopEngine):
                self.stopping = True
            elif isinstance(message, GenerateRequest):
                self.queue.append((identity, message))
            else:
                self.clients.send(identity, RequestFailed(-1, "request", f"unexpected {type(message).__name__}"))

    def _run_request(self, identity: bytes, request: GenerateRequest) -> None:
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
        else:
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

    def _decoder(self, message: GenerateRequest) -> Decoder:
        # Checked again: a client built without hetspec.client may send anything.
        params = SamplingParams.make(message.params if isinstance(message.params, dict) else {})
        prompt = check_prompt(message.prompt, message.messages)
        decoding, server = self.config.decoding, self.config.server
        if message.messages is not None:
            prompt_ids = self.tokenizer.encode_chat(message.messages)
        elif isinstance(prompt, str):
            prompt_ids = self.tokenizer.encode_prompt(prompt)
        else:
            prompt_ids = prompt
            if max(prompt_ids) >= self.n_vocab:
                raise RequestError(f"token id {max(prompt_ids)} is outside the vocabulary (size {self.n_vocab})")
        if not prompt_ids:
            raise RequestError("the prompt encodes to no tokens")
        if len(prompt_ids) >= server.max_context:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context holds "
                               f"{server.max_context} (prompt plus new tokens)")
        gamma = params.gamma or self.gamma
        if gamma > decoding.max_gamma:
            raise RequestError(f"gamma {gamma} exceeds [decoding] max_gamma = {decoding.max_gamma}")
        sequences = params.sequences or decoding.sequences
        if sequences != "dynamic" and sequences > decoding.max_sequences:
            raise RequestError(f"sequences {sequences} exceeds [decoding] max_sequences = {decoding.max_sequences}")
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        request = Request(message.request_id, dataclasses.replace(params, seed=seed), gamma, sequences,
                          seeded=params.seed is not None, rebalance=self.costs is not None and not params.gamma)
        request = dataclasses.replace(request, prior=self.acceptance.prior(request))
        max_new = min(params.max_new_tokens, server.max_context - len(prompt_ids))
        output = Output(prompt_ids, max_new, self.eos, list(params.stop), self.tokenizer)
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


def _worker_info(hello: WorkerHello) -> dict:
    return {"pid": hello.pid, "device": hello.device, "cores": hello.cores, "threads": hello.threads,
            "load_s": round(hello.load_s, 3), "kernels": hello.kernels}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        run = json.load(f)
    scheduler = Scheduler(run)
    serving = False

    def on_sigterm(*_):
        scheduler.stopping = True
        if not serving:          # still starting: nothing to finish, leave now
            raise SystemExit(1)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        try:
            scheduler.start()
        except (HetspecError, OSError) as exc:
            _refuse_clients(scheduler, exc)
            return 1
        serving = True
        scheduler.serve()
        return 0
    finally:
        scheduler.close()
        if os.getppid() != scheduler.parent:   # orphaned: the launcher cannot clean up any more
            shutil.rmtree(os.path.dirname(os.path.abspath(argv[0])), ignore_errors=True)


def _refuse_clients(scheduler: Scheduler, exc: Exception) -> None:
    """Tell whoever asks (the launcher first) why the engine could not start."""
    message = str(exc)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if scheduler.clients.socket.poll(200):
            item = scheduler.clients.recv_nowait()
            if item:
                scheduler.clients.send(item[0], RequestFailed(-1, "start", message))
                return


if __name__ == "__main__":
    sys.exit(main())
