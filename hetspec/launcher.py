"""Starts the engine and stops it, leaving nothing behind.

The launcher owns the runtime directory (mode 0700, holding the ipc://
sockets, the run file and the processes' logs) and starts the scheduler,
which starts and supervises both workers (hetspec.scheduler.supervisor).
Each runs in its own session so a Ctrl-C reaches only the launcher, which
then asks the scheduler to stop them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

from hetspec.config import EngineConfig
from hetspec.core.errors import EngineStartError
from hetspec.ipc.channel import ipc_endpoint, make_runtime_dir
from hetspec.ipc.shm import new_run_id, remove_leftovers
from hetspec.ipc.specs import DraftSpec, TargetSpec
from hetspec.models import resolve_model
from hetspec.scheduler.supervisor import exit_reason, spawn


class Launcher:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.run_id = new_run_id()
        self.runtime_dir = make_runtime_dir(tempfile.mkdtemp(prefix=f"hetspec-{self.run_id}-"))
        self.processes: dict[str, subprocess.Popen] = {}
        server = config.server
        if server.transport == "tcp":
            client = f"tcp://{server.host}:{server.port or _free_port(server.host)}"
        else:
            client = ipc_endpoint(self.runtime_dir, "client")
        self.endpoints = {"client": client, "draft": ipc_endpoint(self.runtime_dir, "draft"),
                          "target": ipc_endpoint(self.runtime_dir, "target")}

    def start(self) -> None:
        c = self.config
        draft_model, target_model = resolve_model(c.draft.model, "draft"), resolve_model(c.target.model, "target")
        draft = DraftSpec(backend=c.draft.backend, model=draft_model, cores=list(c.draft.cores),
                          threads=c.draft.threads, n_ctx=c.draft.n_ctx, weights=c.draft.weights,
                          prefill_weights=c.draft.prefill_weights, prompt_kv=c.draft.prompt_kv,
                          scratch_dir=self.runtime_dir,
                          borrow_cores=list(c.target.cores) if c.draft.prefill_borrows_target_cores else [])
        target = TargetSpec(model=target_model, dtype=c.target.dtype, device=c.target.device,
                            cores=list(c.target.cores), threads=c.target.threads, cpu_kernels=c.target.cpu_kernels,
                            borrow_cores=list(c.draft.cores) if c.target.prefill_borrows_draft_cores else [])
        workers = {   # the scheduler starts these (and starts them again if they die)
            "draft": {"args": ["-m", "hetspec.workers.draft", "--endpoint", self.endpoints["draft"],
                               "--spec", draft.to_json()], "threads": c.draft.threads},
            "target": {"args": ["-m", "hetspec.workers.target", "--endpoint", self.endpoints["target"],
                                "--spec", target.to_json()], "threads": c.target.threads}}
        run = {"run_id": self.run_id, "config": c.to_dict(), "endpoints": self.endpoints,
               "runtime_dir": self.runtime_dir, "workers": workers,
               "models": {"draft": dataclasses.asdict(draft_model), "target": dataclasses.asdict(target_model)}}
        run_file = os.path.join(self.runtime_dir, "run.json")
        with open(run_file, "w") as f:
            json.dump(run, f)
        self.processes["scheduler"] = spawn(["-m", "hetspec.scheduler", run_file],
                                            os.path.join(self.runtime_dir, "scheduler.log"), threads=1)

    def check(self) -> None:
        """Raise EngineStartError naming a process that has exited, with its last log line."""
        for role, process in self.processes.items():
            code = process.poll()
            if code is not None:
                raise EngineStartError(f"the {role} process exited (code {code}): {self.last_log_line(role)}")

    def death(self) -> str | None:
        """How the scheduler ended, with its last log line, if it has."""
        reason = exit_reason(self.processes["scheduler"]) if "scheduler" in self.processes else None
        return reason and f"the scheduler process {reason} (its last log line: {self.last_log_line('scheduler')})"

    def last_log_line(self, role: str) -> str:
        try:
            with open(os.path.join(self.runtime_dir, f"{role}.log"), errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
        except FileNotFoundError:
            return "(no log)"
        return lines[-1] if lines else "(no output)"

    def stop(self, grace_s: float = 10.0) -> None:
        """Wait for the scheduler to leave (it was asked to stop its workers, which
        also die with it), then terminate, then kill; unlink shared memory; remove
        the directory."""
        deadline = time.monotonic() + grace_s
        for process in self.processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(3)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        remove_leftovers(self.run_id)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
