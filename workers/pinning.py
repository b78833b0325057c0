"""Pin a worker to its cores so draft and target never fight for one.

sched_setaffinity on a pid only moves that one thread on Linux, so every
thread of the process is moved (torch's OpenMP pool may already exist).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import psutil


def pin(cores: list[int]) -> None:
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except FileNotFoundError:   # not Linux: psutil moves what it can
        psutil.Process().cpu_affinity(list(cores))
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):
            pass


def set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


@contextmanager
def borrowed_cores(cores: list[int], lent: list[int], set_threads, threads: int):
    """Run on `lent` cores too (one thread each) while the other worker waits; then
    back to the worker's own cores and thread count. Nothing lent: no change."""
    borrow = sorted(set(cores) | set(lent))
    if len(borrow) == len(cores):
        yield
        return
    pin(borrow)
    set_threads(len(borrow))
    try:
        yield
    finally:
        set_threads(threads)
        pin(cores)
