"""Starts the engine, keeps its scheduler alive, and stops it, leaving nothing behind.

The launcher owns the runtime directory (mode 0700, holding the ipc://
sockets, the run file and the processes' logs) and starts the scheduler,
which starts and supervises both workers (hetspec.scheduler.supervisor).
Each runs in its own session so a Ctrl-C reaches only the launcher, which
then asks the scheduler to stop them.

The launcher supervises the scheduler as the scheduler supervises its
workers: a scheduler that dies (a bug past every request's fault boundary,
out of memory, a kill) is started again, with fresh workers, on the same
endpoints. Requests it held are lost (their clients get RequestAbortedError:
generation counts the starts); later ones wait for the new scheduler. One that
dies CRASH_LOOP times in a row before it is ready is given up, with its last
log lines. A scheduler that exits cleanly was asked to stop: that is the end.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
import threading
import time

from hetspec.config import AUTO, EngineConfig
from hetspec.core.errors import EngineStartError
from hetspec.core.running import MAX_RUNNING
from hetspec.ipc.channel import ipc_endpoint, make_runtime_dir
from hetspec.ipc.shm import new_run_id, remove_leftovers
from hetspec.ipc.specs import DraftSpec, Endpoints, RunSpec, TargetSpec, WorkerCommand
from hetspec.models import resolve_model
from hetspec.scheduler.supervisor import State, Worker

WATCH_S = 0.2          # how often the scheduler's process is looked at
READY_FILE = "ready"   # the scheduler writes its pid here once it serves (hetspec.scheduler.__main__)


class Launcher:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.run_id = new_run_id()
        self.runtime_dir = make_runtime_dir(tempfile.mkdtemp(prefix=f"hetspec-{self.run_id}-"))
        self.scheduler: Worker | None = None
        self.generation = 0            # the scheduler's starts after the first: a request held by an
                                       # earlier one was lost with it
        self.stopped: str | None = None   # why the engine ended, once it has
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        server = config.server
        if server.transport == "tcp":
            client = f"tcp://{server.host}:{server.port or _free_port(server.host)}"
        else:
            client = ipc_endpoint(self.runtime_dir, "client")
        self.endpoints = Endpoints(client, ipc_endpoint(self.runtime_dir, "draft"), ipc_endpoint(self.runtime_dir, "target"))
        self.run_file = os.path.join(self.runtime_dir, "run.json")

    @property
    def processes(self) -> dict:
        """The scheduler's process (the workers are its own children)."""
        return {"scheduler": self.scheduler.process} if self.scheduler and self.scheduler.process else {}

    def start(self) -> None:
        self.spec = self.run_spec()
        self.spec.save(self.run_file)
        self.scheduler = Worker("scheduler", ["-m", "hetspec.scheduler", self.run_file], threads=1,
                                log_path=os.path.join(self.runtime_dir, "scheduler.log"), name="the scheduler")
        self.scheduler.start()

    def run_spec(self) -> RunSpec:
        """What the scheduler starts from: the config, the endpoints and both workers' commands."""
        c = self.config
        fit = c.server.max_running == AUTO          # left "auto" by the config on CUDA only: the target fits it
        running = MAX_RUNNING if fit else c.server.max_running
        draft_model, target_model = resolve_model(c.draft.model, "draft"), resolve_model(c.target.model, "target")
        draft_threads = c.draft.threads or len(c.draft.cores)      # 0: the native draft measures
        draft = DraftSpec(backend=c.draft.backend, model=draft_model, cores=list(c.draft.cores),
                          threads=draft_threads, measure_threads=c.draft.threads == 0,
                          n_ctx=c.draft.n_ctx, weights=c.draft.weights,
                          prefill_weights=c.draft.prefill_weights, prompt_kv=c.draft.prompt_kv, vocab=c.draft.vocab,
                          caches=running if c.decoding.batch_drafts else 1,
                          scratch_dir=self.runtime_dir,
                          borrow_cores=list(c.target.cores) if c.draft.prefill_borrows_target_cores else [])
        target = TargetSpec(model=target_model, dtype=c.target.dtype, device=c.target.device,
                            cores=list(c.target.cores), threads=c.target.threads, cpu_kernels=c.target.cpu_kernels,
                            borrow_cores=list(c.draft.cores) if c.target.prefill_borrows_draft_cores
                            or c.target.alone_borrows_draft_cores is not False else [],
                            backend=c.target.backend, n_ctx=c.server.max_context + c.decoding.max_gamma + 1,
                            caches=running, fit_caches=fit, profile=c.target.profile, traces=c.target.traces,
                            passes=c.target.passes, max_window=c.decoding.max_gamma + 1)
        return RunSpec(
            run_id=self.run_id, config=c.to_dict(), endpoints=self.endpoints, runtime_dir=self.runtime_dir,
            draft=WorkerCommand(["-m", "hetspec.workers.draft", "--endpoint", self.endpoints.draft,
                                 "--spec", draft.to_json()], draft_threads),
            target=WorkerCommand(["-m", "hetspec.workers.target", "--endpoint", self.endpoints.target,
                                  "--spec", target.to_json()], c.target.threads),
            draft_model=draft_model, target_model=target_model, launcher_pid=os.getpid())

    def check(self) -> None:
        """While the engine starts: raise EngineStartError if the scheduler has exited,
        with its last log line."""
        if self.scheduler is not None and (reason := self.scheduler.exit_reason()):
            raise EngineStartError(f"the scheduler process {reason}: {self.last_log_line('scheduler')}")

    def watch(self) -> None:
        """Once the engine serves: supervise the scheduler from a thread of this process."""
        self.scheduler.ready()
        self._watcher = threading.Thread(target=self._watch, name="hetspec-supervisor", daemon=True)
        self._watcher.start()

    def stop_supervising(self) -> None:
        """The engine is being stopped: a scheduler that leaves now is not started again."""
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            self.supervise()

    def supervise(self) -> None:
        """Start the scheduler again if it died; mark it ready once it serves. Cheap: a
        waitpid and a small file read. Safe from any thread."""
        with self._lock:
            scheduler = self.scheduler
            if scheduler is None or self.stopped or self._stop.is_set():
                return
            reason = scheduler.exit_reason()
            if reason is None:
                if scheduler.state is State.STARTING and self._serving(scheduler.pid):
                    scheduler.ready()
                return
            self.generation += 1
            if scheduler.process.returncode == 0:          # it was asked to stop (StopEngine), or orphaned
                self.stopped = f"the engine was stopped (its scheduler {reason})"
                return
            remove_leftovers(self.run_id)                  # its shared memory; its workers died with it
            scheduler.died(reason, before_start=self._record_death)
            if scheduler.state is State.FAILED:
                self.stopped = scheduler.failure

    def _record_death(self, reason: str) -> None:
        """The next scheduler reports its predecessors' deaths (engine info)."""
        deaths = [*self.spec.deaths[-9:], {"at": round(time.time(), 3), "reason": reason}]
        self.spec = dataclasses.replace(self.spec, restarts=self.spec.restarts + 1, deaths=deaths)
        self.spec.save(self.run_file)

    def _serving(self, pid: int) -> bool:
        try:
            with open(os.path.join(self.runtime_dir, READY_FILE)) as f:
                return f.read().strip() == str(pid)
        except OSError:
            return False

    def current_generation(self) -> int:
        """The scheduler's generation, a death not seen yet seen first (so that a request
        sent now is counted to the next scheduler, which it will reach)."""
        self.supervise()
        return self.generation

    def death(self) -> str | None:
        """Why the engine cannot serve any more, if it cannot."""
        self.supervise()
        return self.stopped

    def last_death(self) -> str:
        deaths = self.scheduler.deaths if self.scheduler else ()
        return deaths[-1][1] if deaths else "it is gone"

    def restarting(self) -> str | None:
        """Why the scheduler is starting again, while it is."""
        self.supervise()                   # (it may have just begun to serve)
        scheduler = self.scheduler
        if scheduler is None or self.stopped or scheduler.state is not State.STARTING or not scheduler.deaths:
            return None
        return f"the scheduler {scheduler.deaths[-1][1]}; it is starting again (restart {scheduler.restarts})"

    def last_log_line(self, role: str) -> str:
        try:
            with open(os.path.join(self.runtime_dir, f"{role}.log"), errors="replace") as f:
                lines = [line.strip() for line in f if line.strip() and not line.startswith("--- hetspec:")]
        except FileNotFoundError:
            return "(no log)"
        return lines[-1] if lines else "(no output)"

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop supervising; wait for the scheduler to leave (it was asked to stop its
        workers, which also die with it), then terminate, then kill; unlink shared
        memory; remove the directory."""
        self.stop_supervising()
        with self._lock:
            self.stopped = self.stopped or "the engine was stopped"
            if self.scheduler is not None:
                self.scheduler.stop(grace_s)
        remove_leftovers(self.run_id)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
