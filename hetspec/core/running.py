"""How many requests step together ([server] max_running, a target cache each) where the config
says "auto": 4 on a CPU (as llama-server's slots: e7e822d:docs/performance.md), 8 on the paced target,
and on CUDA what the GPU's memory holds, which only the target worker can tell
(workers/target/devices.py), at most MAX_RUNNING. hetspec.config resolves the first two; the
scheduler adopts the worker's answer for the third (scheduler/startup.py, with_running)."""
from __future__ import annotations

MAX_RUNNING, PACED_RUNNING, CPU_RUNNING = 64, 8, 4


def auto_running(target_on: str) -> int | None:
    """max_running "auto" for a target on "host", "paced" or "cuda"; None on CUDA: the worker fits it."""
    return {"host": CPU_RUNNING, "paced": PACED_RUNNING}.get(target_on)
