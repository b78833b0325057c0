"""The engine's two workers with the scheduler's side of the links in this process,
so that one round can be timed by pytest-benchmark.

hetspec.launcher.Launcher writes the run spec as the engine does; the scheduler
(hetspec.scheduler.service.Scheduler) is built here from it rather than in a process
of its own, and starts the workers exactly as in the engine (same specs, pinning,
threads, shared memory layout), with direct access to its DraftLink and TargetLink.
"""
from __future__ import annotations

from hetspec.config import load_config
from hetspec.launcher import Launcher
from hetspec.scheduler.service import Scheduler


class Rig:
    def __init__(self, config: dict):
        self.launcher = Launcher(load_config(config))
        self.scheduler = None
        try:
            self.scheduler = Scheduler(self.launcher.run_spec())
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
