"""Which cores each process takes where the config says "auto": the draft's, the target's and
the scheduler's (hetspec.config resolves them last, once every section is checked)."""
from __future__ import annotations

from typing import Literal

import psutil

from hetspec.core.errors import ConfigError
from hetspec.core.params import show

Auto = Literal["auto"]
AUTO: Auto = "auto"


def assign_cores(draft: tuple[int, ...] | Auto, target: tuple[int, ...] | Auto,
                 scheduler: tuple[int, ...] | Auto = AUTO, target_on: str = "host") -> tuple[tuple[int, ...], ...]:
    """Resolve "auto": the draft owns the first core, the target the rest (on a
    2-core machine: draft on core 0, target on core 1), and the scheduler shares the
    target's. A target on CUDA needs a core to drive it (its launches, its driver's
    threads, its eager host work): it owns the first, the scheduler the second, the
    draft the rest (on 2 cores, the scheduler shares the target's). A paced target
    uses no core: it shares the first with the scheduler, and the draft may take every
    core, the first last: its threads are measured at start-up (thread_choice.py), so
    it spreads onto the scheduler's core only where that makes its step faster.

    The scheduler's own work (starting both workers, streaming, bookkeeping) runs
    while both compute, so it sits beside the side with time to spare, which the
    budget makes the target (e7e822d:docs/performance.md, "Where the scheduler sits")."""
    cores = sorted(psutil.Process().cpu_affinity())
    for name, value in (("draft", draft), ("target", target), ("server", scheduler)):
        if value != AUTO:
            _check_cores(name, value, cores)
    if target_on == "cuda":
        return _beside_cuda(cores, draft, target, scheduler)
    if draft == AUTO:
        draft = (cores[0],) if target_on == "host" else tuple(cores[1:] + cores[:1])
    if target == AUTO:
        rest = [x for x in cores if x not in draft] or cores
        target = tuple(rest) if target_on == "host" else (rest[0],)
    return tuple(draft), tuple(target), tuple(target if scheduler == AUTO else scheduler)


def _beside_cuda(cores: list[int], draft, target, scheduler) -> tuple[tuple[int, ...], ...]:
    """A CUDA target's cores: the first its own, the second the scheduler's, the rest the draft's."""
    target = (cores[0],) if target == AUTO else target
    if scheduler == AUTO:
        scheduler = (cores[1],) if len(cores) > 2 else target
    if draft == AUTO:
        draft = tuple(x for x in cores if x not in target + scheduler) or tuple(cores[-1:])
    return tuple(draft), tuple(target), tuple(scheduler)


def _check_cores(name: str, value, cores: list[int]) -> None:
    if not isinstance(value, tuple) or not value or not all(isinstance(x, int) and not isinstance(x, bool) for x in value) \
            or len(set(value)) != len(value):
        raise ConfigError(f"[{name}] cores must be 'auto' or a non-empty list of distinct core numbers, "
                          f"got {show(value)}")
    missing = sorted(set(value) - set(cores))
    if missing:
        raise ConfigError(f"[{name}] cores {missing} do not exist on this machine (available: {cores})")
