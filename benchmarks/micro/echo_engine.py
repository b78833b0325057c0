"""The real scheduler (and so the real Decoder) over the echo workers (echo_workers.py), in this
process: the scheduler's time per round with workers that take none.

The engine starts as the launcher starts it (Launcher.run_spec, the scheduler's start-up:
calibration, shared buffers, capabilities), but for the workers' commands, which run the echo
workers on the cores the config gives the real ones. A request goes through the scheduler's own
path: a client socket sends a GenerateRequest to its client endpoint, and this process steps the
scheduler's loop (Scheduler._step: read clients, admit, run a turn) until the request's Finished
comes back. Alone, a request's turn is all of it: one step.

    python -m hetspec.benchmarks.micro.echo_engine [--mode duodec] [--new-tokens 256] [--profile N]
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import itertools
import os
import pstats
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
                "rounds": s["rounds"], "spec_rounds": s["spec_rounds"], "acceptance_rate": round(s["acceptance_rate"], 3),
                "tokens_per_round": round(s["mean_accepted_per_round"], 3), "new_tokens": s["new_tokens"]}


class EchoEngine:
    def __init__(self, decoding: dict | None = None, echo: EchoSpec | None = None):
        self.echo = echo or EchoSpec(miss_every=MISS_EVERY)
        self.affinity = os.sched_getaffinity(0)     # the scheduler pins this process: given back on close
        self.launcher = Launcher(load_config(echo_config(decoding)))
        self.scheduler, self.client = None, None
        self.ids = itertools.count(1)
        try:
            self.scheduler = Scheduler(echo_run_spec(self.launcher, self.echo))
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

    def generate(self, prompt: list[int], profile: cProfile.Profile | None = None, **params) -> Run:
        """One request (params: SamplingParams fields) through the scheduler's loop; `profile`,
        if given, profiles the scheduler's steps."""
        rid = next(self.ids)
        self.client.send(GenerateRequest(rid, prompt=list(prompt), params=params))
        streamed, wall = [], 0.0
        while True:
            started = time.perf_counter()
            if profile is not None:
                profile.runcall(self.scheduler._step)
            else:
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


def profile_rounds(engine: EchoEngine, mode: str, new_tokens: int, repeats: int) -> tuple[list[Run], str]:
    """Runs of one mode, profiled: (the runs, the profile's top functions by own time per round)."""
    profile, runs = cProfile.Profile(), []
    for _ in range(repeats):
        runs.append(engine.generate(PROMPT, profile, mode=mode, max_new_tokens=new_tokens, temperature=0.0))
    rounds = sum(r.stats["rounds"] for r in runs)
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    out.write(f"(totals over {repeats} requests, {rounds} rounds: divide by {rounds} for per round)\n")
    return runs, out.getvalue()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="duodec", choices=["duodec", "sequential", "target"])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--gamma", default="auto", help="auto (the workers then report modelled seconds) or a number")
    parser.add_argument("--profile", action="store_true", help="profile the scheduler (cProfile) and print it")
    args = parser.parse_args(argv)
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    echo = EchoSpec(miss_every=MISS_EVERY, seconds="modelled" if gamma == "auto" else "real")   # (test_scheduler_round.py)
    with EchoEngine({"gamma": gamma}, echo) as engine:
        engine.generate(PROMPT, mode=args.mode, max_new_tokens=args.new_tokens, temperature=0.0)   # warm-up
        if args.profile:
            runs, text = profile_rounds(engine, args.mode, args.new_tokens, args.repeats)
            print(text)
        else:
            runs = [engine.generate(PROMPT, mode=args.mode, max_new_tokens=args.new_tokens, temperature=0.0)
                    for _ in range(args.repeats)]
    for run in runs:
        print(run.summary())
    best = min(runs, key=lambda r: r.round_ms)
    print(f"{args.mode}: best {best.round_ms:.3f} ms a round (wall), overhead {best.overhead_ms:.3f} ms a spec round; "
          f"median {sorted(r.round_ms for r in runs)[len(runs) // 2]:.3f} ms")


if __name__ == "__main__":
    main()
