"""Pin every thread of this process to a set of cores.

sched_setaffinity on a pid moves only that one thread on Linux, so each thread
of the process is moved (torch's OpenMP pool or zmq's I/O threads may already
exist); threads started later inherit the set.
"""
from __future__ import annotations

import os

import psutil


def pin(cores) -> None:
    cores = list(cores)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except FileNotFoundError:   # not Linux: psutil moves what it can
        psutil.Process().cpu_affinity(cores)
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):   # a thread that just ended
            pass
