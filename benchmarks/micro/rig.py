"""The engine's two workers with the scheduler's side of the links in this process,
so that one round can be timed by pytest-benchmark.

hetspec.launcher.Launcher starts the workers exactly as the engine does (same
specs, pinning, threads, shared memory layout); only the scheduler process is
left out and hetspec.scheduler.service.Scheduler is built here instead, which gives
direct access to its DraftLink and TargetLink.
"""
from __future__ import annotations

import json

from hetspec.config import load_config
from hetspec.launcher import Launcher
from hetspec.scheduler.service import Scheduler


class _WorkersOnly(Launcher):
    run_file: str | None = None

    def _spawn(self, role, args, threads):
        if role == "scheduler":          # built in-process instead (see start_rig)
            self.run_file = args[-1]
            return
        super()._spawn(role, args, threads)


class Rig:
    def __init__(self, config: dict):
        self.launcher = _WorkersOnly(load_config(config))
        self.scheduler = None
        try:
            self.launcher.start()
            with open(self.launcher.run_file) as f:
                self.scheduler = Scheduler(json.load(f))
            self.scheduler.start()
        except BaseException:
            self.close()
            raise

    @property
    def draft(self):
        return self.scheduler.draft

    @property
    def target(self):
        return self.scheduler.target

    def close(self) -> None:
        try:
            if self.scheduler is not None:
                self.scheduler.close()
        finally:
            self.launcher.stop()
