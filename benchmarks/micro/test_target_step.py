"""One target-only step through the real target worker: asked for, as a rest runs it
(the scheduler's link sends one token, the worker runs it, on the draft's cores too where
the engine lends them, and answers with its choice), and decoded ahead, as mode `target`
runs it. extra_info keeps the worker's
own seconds for the pass, so `round - worker` is what a round costs beside the model:
messages, wake-ups, the worker's Python around its kernels."""
from __future__ import annotations

import numpy as np
import pytest

from hetspec.benchmarks.micro.rig import Rig
from hetspec.core.sampling import GREEDY

ROUNDS = 200       # steps decoded ahead, timed one by one


@pytest.fixture(scope="module")
def rig(bench_config):
    rig = Rig({section: dict(values) for section, values in bench_config.items()})
    yield rig
    rig.close()


def test_target_alone_round(benchmark, rig, context_ids):
    context = np.asarray(context_ids, dtype=np.int32)
    borrow = rig.scheduler.caps.alone_borrows_cores
    rig.target.start_verify(1, 0, context, 0, 1, GREEDY, borrow)
    token = int(rig.target.finish_verify(1).choice[0])
    worker_s = []

    def one_round():
        rig.target.start_verify(1, 0, np.array([token], np.int32), len(context), 1, GREEDY, borrow)
        verdict = rig.target.finish_verify(1)
        worker_s.append(verdict.seconds)
        return int(verdict.choice[0])

    benchmark(one_round)
    round_s = benchmark.stats.stats.median
    benchmark.extra_info.update(context=len(context), borrowed_cores=borrow,
                                worker_median_ms=1e3 * float(np.median(worker_s)),
                                beside_the_model_ms=1e3 * (round_s - float(np.median(worker_s))))


def test_target_alone_step_decoded_ahead(benchmark, rig, context_ids):
    """The same step where the target decodes ahead (Decoder.ahead, mode target): the
    scheduler takes a token it did not ask for. Against test_target_alone_round, the
    difference is the round trip that running ahead hides."""
    context = list(context_ids)
    borrow = rig.scheduler.caps.alone_borrows_cores
    rig.target.start_verify(1, 0, np.asarray(context, np.int32), 0, 1, GREEDY, borrow, ahead=ROUNDS + 1)
    context.append(int(rig.target.finish_verify(1).choice[0]))
    worker_s = []

    def one_step():
        verdict = rig.target.ran_ahead(np.asarray(context, np.int32))
        worker_s.append(verdict.seconds)
        context.append(int(verdict.choice[0]))

    benchmark.pedantic(one_step, rounds=ROUNDS, iterations=1)
    rig.target.settle()
    step_s = benchmark.stats.stats.median
    benchmark.extra_info.update(context=len(context_ids), borrowed_cores=borrow,
                                worker_median_ms=1e3 * float(np.median(worker_s)),
                                beside_the_model_ms=1e3 * (step_s - float(np.median(worker_s))))
