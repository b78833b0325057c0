"""One target-only step through the real target worker, asked for (as a rest runs it) and decoded
ahead (mode target); extra_info keeps what the step costs beside the model."""
from __future__ import annotations

import numpy as np

from hetspec.benchmarks.micro.conftest import beside_the_model
from hetspec.core.sampling import GREEDY

ROUNDS = 200       # steps decoded ahead, timed one by one


def test_target_alone_round(benchmark, scheduler, context_ids):
    context = np.asarray(context_ids, dtype=np.int32)
    borrow = scheduler.caps.alone_borrows_cores
    scheduler.target.start_verify(1, 0, context, 0, 1, GREEDY, borrow)
    token = int(scheduler.target.finish_verify(1).choice[0])
    worker_s = []

    def one_round():
        scheduler.target.start_verify(1, 0, np.array([token], np.int32), len(context), 1, GREEDY, borrow)
        verdict = scheduler.target.finish_verify(1)
        worker_s.append(verdict.seconds)
        return int(verdict.choice[0])

    benchmark(one_round)
    beside_the_model(benchmark, worker_s, context=len(context), borrowed_cores=borrow)


def test_target_alone_step_decoded_ahead(benchmark, scheduler, context_ids):
    """The scheduler takes a token it did not ask for: against the round, what running ahead hides."""
    context = list(context_ids)
    borrow = scheduler.caps.alone_borrows_cores
    scheduler.target.start_verify(1, 0, np.asarray(context, np.int32), 0, 1, GREEDY, borrow, ahead=ROUNDS + 1)
    context.append(int(scheduler.target.finish_verify(1).choice[0]))
    worker_s = []

    def one_step():
        verdict = scheduler.target.ran_ahead(np.asarray(context, np.int32))
        worker_s.append(verdict.seconds)
        context.append(int(verdict.choice[0]))

    benchmark.pedantic(one_step, rounds=ROUNDS, iterations=1)
    scheduler.target.settle()
    beside_the_model(benchmark, worker_s, context=len(context_ids), borrowed_cores=borrow)
