"""Supervised processes: the scheduler restarts a worker that dies (a killed draft costs
speed, a killed target its running requests, never the engine), and the launcher the
scheduler. One that dies before it is ready CRASH_LOOP times in a row is given up (bad
weights or too little memory fail the same way forever), with its last log lines.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque

from hetspec.core.errors import EngineDeadError
from hetspec.core.params import Choice
from hetspec.ipc.messages import WorkerHello
from hetspec.ipc.specs import RunSpec

CRASH_LOOP = 3        # deaths before ready, in a row, that end the restarts
HISTORY = 10          # deaths remembered per worker (engine info)
LOG_LINES = 5         # log lines quoted when a worker is given up


def spawn(args: list[str], log_path: str, threads: int) -> subprocess.Popen:
    """A hetspec Python process in its own session (a Ctrl-C reaches only the launcher), one
    OpenMP thread per owned core (borrowing cores re-pins: workers/common/thread_pinning.py)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"), PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as log:   # the child keeps its own copy
        return subprocess.Popen([sys.executable, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def exit_reason(process: subprocess.Popen) -> str | None:
    """None while the process runs; else how it ended ("was killed by SIGKILL")."""
    code = process.poll()
    if code is None:
        return None
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class State(Choice):
    """Where a supervised process stands."""
    STARTING = "starting"      # loading its model (a worker) or its workers (the scheduler)
    READY = "ready"            # serving
    FAILED = "failed"          # given up: it kept dying before it was ready


class Worker:
    """One supervised process (a worker, or the launcher's scheduler) and its history."""

    def __init__(self, role: str, args: list[str], threads: int, log_path: str, name: str = ""):
        self.role, self.args, self.threads, self.log_path = role, args, threads, log_path
        self.name = name or f"the {role} worker"
        self.process: subprocess.Popen | None = None
        self.state = State.STARTING
        self.restarts = 0
        self.deaths: deque = deque(maxlen=HISTORY)   # (time, reason)
        self.failed_in_a_row = 0
        self.failure: str | None = None               # why it was given up

    def start(self) -> None:
        self.process = spawn(self.args, self.log_path, self.threads)
        self.state = State.STARTING

    @property
    def ready_now(self) -> bool:
        return self.state is State.READY

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def exit_reason(self) -> str | None:
        """None while the process runs; else how it ended (the process is reaped)."""
        return None if self.process is None else exit_reason(self.process)

    def died(self, reason: str, before_start=None) -> None:
        """Record a death; start it again (after before_start(reason)) unless in a crash loop."""
        self.deaths.append((time.time(), reason))
        self.failed_in_a_row = self.failed_in_a_row + 1 if self.state is State.STARTING else 0
        if self.state is State.STARTING and self.failed_in_a_row >= CRASH_LOOP:
            self.state = State.FAILED
            self.failure = (f"{self.name} died {self.failed_in_a_row} times in a row before it was "
                            f"ready ({reason}); it is not restarted again. Its last log lines:\n"
                            + "\n".join(self.last_log_lines()))
            return
        self.restarts += 1
        self._mark_log(f"--- hetspec: {self.name} {reason}; restart {self.restarts} ---")
        if before_start is not None:
            before_start(reason)
        self.start()

    def ready(self) -> None:
        self.state = State.READY
        self.failed_in_a_row = 0

    def last_log_lines(self, n: int = LOG_LINES) -> list[str]:
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [line.rstrip() for line in f if line.strip()]
        except FileNotFoundError:
            return ["(no log)"]
        lines = [line for line in lines if not line.startswith("--- hetspec:")]
        return lines[-n:] or ["(no output)"]

    def _mark_log(self, line: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(line + "\n")

    def info(self) -> dict:
        return {"pid": self.pid, "state": self.state, "restarts": self.restarts,
                "deaths": [{"at": round(at, 3), "reason": reason} for at, reason in self.deaths],
                **({"failure": self.failure} if self.failure else {})}

    def stop(self, grace_s: float) -> None:
        """Wait for the process to leave (it was told to), then terminate, then kill."""
        if self.process is None:
            return
        for step in (lambda: None, self.process.terminate, self.process.kill):
            step()
            try:
                self.process.wait(grace_s)
                return
            except subprocess.TimeoutExpired:
                continue


class Crew:
    """Both workers with their links, watched between steps; a restarted one maps the same buffers."""

    def __init__(self, spec: RunSpec, links: dict):
        self.links = links
        self.workers = {role: Worker(role, command.args, command.threads, os.path.join(spec.runtime_dir, f"{role}.log"))
                        for role, command in (("draft", spec.draft), ("target", spec.target))}
        for role, link in links.items():
            link.process = self.workers[role]

    def start(self) -> None:
        for worker in self.workers.values():
            worker.start()

    def check(self) -> None:
        """Restart a worker that died (or give it up), and finish bringing up one that has
        loaded. A link with a command outstanding is left alone: its wait() reports the death."""
        for role, worker in self.workers.items():
            link = self.links[role]
            if worker.state is State.FAILED or link.busy:
                continue
            if reason := worker.exit_reason():
                link.lost()
                worker.died(reason)
            elif worker.state is State.STARTING and link.channel.waiting():
                hello = link.channel.recv(0)
                if isinstance(hello, WorkerHello):   # anything else is a dead worker's last words
                    link.hello = hello
                    try:
                        link.reattach()
                    except EngineDeadError:           # died again at once: the next check sees it
                        continue
                    worker.ready()

    def ready(self, role: str) -> bool:
        return self.workers[role].state is State.READY

    def unavailable(self, role: str) -> str | None:
        """Why this worker cannot take commands now (None: it can)."""
        worker = self.workers[role]
        if worker.state is State.FAILED:
            return worker.failure
        if worker.state is State.STARTING:
            return f"the {role} worker is restarting (it {worker.deaths[-1][1]})" if worker.deaths else \
                f"the {role} worker is starting"
        return None

    def info(self) -> dict:
        return {role: worker.info() for role, worker in self.workers.items()}

    def restarts(self) -> dict:
        return {role: worker.restarts for role, worker in self.workers.items()}
