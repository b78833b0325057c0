"""The scheduler process: python -m hetspec.scheduler RUN_FILE (started by hetspec.launcher).

Builds the Scheduler from the launcher's run file, starts it (or tells the
launcher why it could not), serves until asked to stop or orphaned, and
leaves nothing behind.
"""
from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import time

from hetspec.core.errors import HetspecError
from hetspec.ipc.messages import RequestFailed
from hetspec.ipc.specs import RunSpec
from hetspec.launcher import READY_FILE
from hetspec.scheduler.scheduler import Scheduler


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    scheduler = Scheduler(RunSpec.load(argv[0]))
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
        gc.freeze()             # start-up's objects leave the collector's view: no full scan of them mid-round
        _say_ready(os.path.dirname(os.path.abspath(argv[0])))
        scheduler.serve()
        return 0
    finally:
        scheduler.close()
        if os.getppid() != scheduler.parent:   # orphaned: the launcher cannot clean up any more
            shutil.rmtree(os.path.dirname(os.path.abspath(argv[0])), ignore_errors=True)


def _say_ready(runtime_dir: str) -> None:
    """Tell the launcher that this scheduler serves (its pid in READY_FILE)."""
    partial = os.path.join(runtime_dir, f"{READY_FILE}.{os.getpid()}")
    with open(partial, "w") as f:
        f.write(str(os.getpid()))
    os.replace(partial, os.path.join(runtime_dir, READY_FILE))


def _refuse_clients(scheduler: Scheduler, exc: Exception) -> None:
    """Tell whoever asks (the launcher first) why the engine could not start."""
    message = str(exc)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if scheduler.clients.router.waiting(200):
            item = scheduler.clients.router.recv_nowait()
            if item:
                scheduler.clients.send(item[0], RequestFailed(-1, "start", message))
                return


if __name__ == "__main__":
    sys.exit(main())
