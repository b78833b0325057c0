"""Pin a worker to its cores so draft and target never fight for one.

Every thread is moved (hetspec.core.pinning.pin); then each OpenMP thread
gets a core of its own: allowed a set of cores, two compute threads were
often left on one of them, as the kernel tends to wake a thread where it
last ran (e7e822d:docs/performance.md).
"""
from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from contextlib import contextmanager

from hetspec.core.pinning import pin

_TEAM_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def spread_openmp_threads(cores: list[int], threads: int) -> int:
    """Pin OpenMP thread i (of every GNU OpenMP runtime loaded: torch's, or
    llama.cpp's) to cores[i % len(cores)], thread 0 being the caller. The
    runtime hands the same pool threads to every later parallel region of up
    to `threads` threads, in the same order. Returns how many runtimes."""
    runtimes = _openmp_runtimes()
    for gomp in runtimes:
        def body(_, gomp=gomp):
            try:
                os.sched_setaffinity(0, [cores[gomp.omp_get_thread_num() % len(cores)]])
            except OSError:     # a core taken away meanwhile: the thread keeps the whole set
                pass
        gomp.GOMP_parallel(_TEAM_BODY(body), None, threads, 0)
    return len(runtimes)


@functools.cache
def _openmp_runtimes() -> tuple:
    """The GNU OpenMP libraries mapped into this process (a wheel may bundle its
    own). Looked up once, since reading /proc/self/maps lies on the way to a
    first token (measured: e7e822d:docs/kernels.md): by a worker's first spread, the
    libraries that bring them (torch, imported first; llama.cpp, loaded with
    the draft) are loaded."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "/libgomp" in line})
    except FileNotFoundError:
        return ()
    runtimes = []
    for path in paths:
        gomp = ctypes.CDLL(path)   # already mapped: the same instance, not a second runtime
        gomp.GOMP_parallel.argtypes = [_TEAM_BODY, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        gomp.omp_get_thread_num.restype = ctypes.c_int
        runtimes.append(gomp)
    return tuple(runtimes)


def set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def pin_threads(cores: list[int], threads: int, thread_ids: Callable[[], list[int]] | None = None) -> None:
    """Every thread on these cores, each compute thread on one of its own: OpenMP's,
    and those of a model with a pool of its own (thread_ids: their kernel ids, the
    caller's thread taking cores[0])."""
    pin(cores)
    if threads > 1 and len(cores) > 1:
        spread_openmp_threads(cores, threads)
        if thread_ids is not None:
            os.sched_setaffinity(0, [cores[0]])
            for i, tid in enumerate(thread_ids(), start=1):
                try:
                    os.sched_setaffinity(tid, [cores[i % len(cores)]])
                except OSError:      # a thread that just ended, or a core taken away
                    pass


class CoreLoan:
    """The other worker's cores, held from the first command that asks for them to the
    first that does not: re-pinning around every token cost more than a second thread
    gained (a token of a small model takes milliseconds; measured: e7e822d:docs/performance.md)."""

    def __init__(self, cores: list[int], lent: list[int], set_threads, threads: int,
                 thread_ids: Callable[[], list[int]] | None = None):
        self.cores, self.threads, self.set_threads, self.thread_ids = list(cores), threads, set_threads, thread_ids
        self.wide = list(cores) + [c for c in lent if c not in cores]
        self.held = False

    def hold(self, borrow: bool) -> None:
        borrow = borrow and len(self.wide) > len(self.cores)
        if borrow != self.held:
            cores, threads = (self.wide, len(self.wide)) if borrow else (self.cores, self.threads)
            self.set_threads(threads)
            pin_threads(cores, threads, self.thread_ids)
            self.held = borrow


@contextmanager
def borrowed_cores(cores: list[int], lent: list[int], set_threads, threads: int,
                   thread_ids: Callable[[], list[int]] | None = None):
    """Run on `lent` cores too (one thread each) while the other worker waits; then
    back to the worker's own cores and thread count. Nothing lent: no change.
    The worker's main thread stays on its own first core (thread_ids: as CoreLoan)."""
    loan = CoreLoan(cores, lent, set_threads, threads, thread_ids)
    loan.hold(True)
    try:
        yield
    finally:
        loan.hold(False)
