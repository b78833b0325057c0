"""Numpy arrays in named POSIX shared memory.

The creating process owns a segment and unlinks it. Python's resource tracker
registers a segment even when another process merely attaches to it, and
would unlink it when that process exits (cpython #116849); attaching here
unregisters it so only the owner ever unlinks.
"""
from __future__ import annotations

import os
import secrets
from multiprocessing import resource_tracker, shared_memory

import numpy as np

SEGMENT_PREFIX = "hetspec-"


def segment_name(run_id: str, purpose: str) -> str:
    """Unique per engine run (pid plus randomness), recognisable in /dev/shm."""
    return f"{SEGMENT_PREFIX}{run_id}-{purpose}"


def new_run_id() -> str:
    return f"{os.getpid()}-{secrets.token_hex(3)}"


class SharedArray:
    """One numpy array backed by one shared-memory segment."""

    def __init__(self, shm: shared_memory.SharedMemory, shape, dtype, owner: bool):
        self._shm = shm
        self.owner = owner
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.array = np.ndarray(self.shape, dtype=self.dtype, buffer=shm.buf)

    @property
    def name(self) -> str:
        return self._shm.name

    @classmethod
    def create(cls, name: str, shape, dtype) -> SharedArray:
        size = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        return cls(shared_memory.SharedMemory(name=name, create=True, size=size), shape, dtype, owner=True)

    @classmethod
    def attach(cls, name: str, shape, dtype) -> SharedArray:
        shm = shared_memory.SharedMemory(name=name, create=False)
        resource_tracker.unregister(shm._name, "shared_memory")  # the owner unlinks, not us
        return cls(shm, shape, dtype, owner=False)

    def spec(self) -> list:
        """What another process needs to attach: [name, shape, dtype]."""
        return [self.name, list(self.shape), self.dtype.str]

    def close(self) -> None:
        """Unmap, and unlink if this process created the segment."""
        if self._shm is None:
            return
        self.array = None
        shm, self._shm = self._shm, None
        try:
            shm.close()
        except BufferError:
            pass  # a numpy view is still alive; the mapping goes with the process
        if self.owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


def attach_all(specs: dict[str, list]) -> dict[str, SharedArray]:
    return {key: SharedArray.attach(name, shape, dtype) for key, (name, shape, dtype) in specs.items()}


def remove_leftovers(run_id: str) -> list[str]:
    """Unlink any segment of this run still in /dev/shm (after a crashed owner)."""
    removed = []
    prefix = segment_name(run_id, "")
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join("/dev/shm", name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed
