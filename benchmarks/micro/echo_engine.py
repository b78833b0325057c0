"""The real scheduler (and so the real Decoder) in this process over the echo workers
(echo_workers.py): the scheduler's time per round with workers that take none. It starts as the
launcher starts it (Launcher.run_spec: calibration, shared buffers, capabilities) but for the
workers' commands; a request goes through the scheduler's own path, a client socket sending a
GenerateRequest while this process steps the scheduler's loop until its Finished comes back.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import time
from dataclasses import dataclass

import zmq

from hetspec.benchmarks.micro.echo_workers import EchoSpec, command
from hetspec.config import load_config
from hetspec.core.errors import error_from_kind
from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import Finished, GenerateRequest, RequestFailed, TokensEvent
from hetspec.ipc.specs import RunSpec, WorkerCommand
from hetspec.launcher import Launcher
from hetspec.scheduler.scheduler import Scheduler

ECHO_MODEL = "random:vocab=49152,tokenizer=smollm2"   # SmolLM2's tokenizer (the scheduler's); no weights are loaded
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 2]   # a short chat-like prompt's ids
MISS_EVERY = 8           # the echo draft's miss rate: per-token acceptance about 7/8


def echo_config(decoding: dict | None = None) -> dict:
    """The engine's config with the echo model on both sides; speculation "always", so
    that every round speculates (the gate would rest a draft this fast all the same)."""
    return {"draft": {"backend": "torch", "model": ECHO_MODEL}, "target": {"model": ECHO_MODEL},
            "decoding": {"speculation": "always", **(decoding or {})}}


def echo_run_spec(launcher: Launcher, echo: EchoSpec) -> RunSpec:
    """The launcher's run spec, its workers' commands the echo workers' (pinned as the real ones)."""
    spec, c = launcher.run_spec(), launcher.config

    def worker(role: str, endpoint: str, cores) -> WorkerCommand:
        return WorkerCommand(command(role, endpoint, dataclasses.replace(echo, cores=list(cores))), 1)

    return dataclasses.replace(spec, draft=worker("draft", spec.endpoints.draft, c.draft.cores),
                               target=worker("target", spec.endpoints.target, c.target.cores))


@dataclass
class Run:
    """One request's outcome, and the wall time of the scheduler's steps that ran it."""
    finished: Finished
    streamed: list[int]          # token ids of its TokensEvents, in order
    wall_s: float

    @property
    def stats(self) -> dict:
        return self.finished.stats

    @property
    def round_ms(self) -> float:
        """Scheduler wall time per round (prefill and start-up of the request included)."""
        return 1000 * self.wall_s / max(self.stats["rounds"], 1)

    @property
    def overhead_ms(self) -> float:
        """The engine's own overhead per speculative round (Stats: round wall less the workers' seconds)."""
        return 1000 * self.stats["overhead_s"] / max(self.stats["spec_rounds"], 1)

    def summary(self) -> dict:
        s = self.stats
        return {"round_ms": round(self.round_ms, 4), "overhead_ms": round(self.overhead_ms, 4),
                "rounds": s["rounds"], "spec_rounds": s["spec_rounds"],
                "acceptance_rate": round(s["acceptance_rate"], 3),
                "tokens_per_round": round(s["mean_accepted_per_round"], 3), "new_tokens": s["new_tokens"]}


class EchoEngine:
    """The scheduler in this process over the echo workers, or, given an engine `config`, over its real ones."""

    def __init__(self, decoding: dict | None = None, echo: EchoSpec | None = None, config: dict | None = None):
        self.echo = echo or EchoSpec(miss_every=MISS_EVERY)
        self.affinity = os.sched_getaffinity(0)     # the scheduler pins this process: given back on close
        self.launcher = Launcher(load_config(config or echo_config(decoding)))
        self.scheduler, self.client = None, None
        self.ids = itertools.count(1)
        try:
            self.scheduler = Scheduler(self.launcher.run_spec() if config else echo_run_spec(self.launcher, self.echo))
            self.scheduler.start()
            self.client = Channel(self.scheduler.context, self.scheduler.clients.endpoint, bind=False)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> EchoEngine:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def info(self) -> dict:
        return self.scheduler.info

    def generate(self, prompt: list[int], **params) -> Run:
        """One request (params: SamplingParams fields) through the scheduler's loop."""
        rid = next(self.ids)
        self.client.send(GenerateRequest(rid, prompt=list(prompt), params=params))
        streamed, wall = [], 0.0
        while True:
            started = time.perf_counter()
            self.scheduler._step()
            wall += time.perf_counter() - started
            while (message := self.client.recv(0)) is not None:
                if isinstance(message, RequestFailed):
                    raise error_from_kind(message.kind, message.message)
                if isinstance(message, TokensEvent):
                    streamed.extend(message.token_ids)
                elif isinstance(message, Finished) and message.request_id == rid:
                    return Run(message, streamed, wall)

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.socket.setsockopt(zmq.LINGER, 0)
                self.client.close()
            if self.scheduler is not None:
                self.scheduler.close()
        finally:
            self.launcher.stop()
            os.sched_setaffinity(0, self.affinity)
