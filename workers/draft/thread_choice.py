"""How many threads the native draft's step takes: measured at start-up where [draft]
threads is 0 and the draft has several cores. A step of a small draft is a few hundred
products of tens of microseconds; split among threads (pool.h) each is shorter, but
the threads must meet after each one, and on a busy or small machine a second thread
can cost more than it gains. So a few steps are timed at 1, 2, 4, ... threads and at
one a core, and the fastest count is kept. The counts take turns, ROUNDS times: start-up
is busy (the target and the scheduler's tokenizers load beside it), and a count timed in
one go could meet a busy moment and lose."""
from __future__ import annotations

import time

import numpy as np

from hetspec.workers.common.thread_pinning import pin_threads

CONTEXT = 64     # random tokens before the timed step: a short context, as a draft's often is
STEPS = 2        # timed steps a count and round, the fastest counting, after one untimed
ROUNDS = 5       # turns of every count


def candidates(cores: int) -> list[int]:
    """1, 2, 4, ... below `cores`, then `cores`."""
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return counts + [cores]


def step_seconds(model, cores: list[int], threads: int) -> tuple[int, float]:
    """(the width the model took, its fastest step at that width), its threads pinned one a core."""
    threads = model.set_threads(threads)
    pin_threads(cores, threads, model.thread_ids)
    token = model.n_vocab // 2
    best = float("inf")
    for i in range(STEPS + 1):
        start = time.perf_counter()
        model.forward([token], CONTEXT)
        if i:
            best = min(best, time.perf_counter() - start)
    return threads, best


def fastest_threads(model, cores: list[int]) -> tuple[int, list[int]]:
    """(the thread count whose step was fastest, the counts timed); the model is left
    at that count, its threads pinned to the first cores, one each, and resting. Its cache holds a random context
    after (the drafter's bookkeeping knows none of it: its first feed starts at 0)."""
    context = np.random.default_rng(0).integers(0, model.n_vocab, CONTEXT)
    model.forward(context, 0)
    seconds: dict[int, float] = {}
    for _ in range(ROUNDS):
        for width, best in (step_seconds(model, cores[:n], n) for n in candidates(len(cores))):
            seconds[width] = min(best, seconds.get(width, best))
    chosen = min(seconds, key=seconds.get)
    pin_threads(cores[:chosen], model.set_threads(chosen), model.thread_ids)
    model.rest()
    return chosen, sorted(seconds)
