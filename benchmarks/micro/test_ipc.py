"""One IPC round trip from the scheduler's TargetLink to a target worker on a tiny random model: a greedy window
of gamma + 1 ids, and gamma + 1 vocabulary-sized probability rows that the scheduler reads in full. The trip itself
is extra_info's beside_the_model_ms: the measured median less the worker's own seconds for its pass."""
from __future__ import annotations

import numpy as np
import pytest

from hetspec.benchmarks.micro.conftest import GAMMA, VOCABS, beside_the_model, in_process_scheduler, tiny_config
from hetspec.core.sampling import GREEDY, Rule, Sampling

ROWS = GAMMA + 1
CONTEXT = 100


@pytest.fixture(scope="module", params=list(VOCABS), ids=lambda v: f"vocab-{VOCABS[v]}")
def link(request):
    """The target link, its worker holding a context of CONTEXT tokens."""
    with in_process_scheduler(tiny_config(request.param)) as scheduler:
        scheduler.target.start_verify(1, 0, np.arange(1000, 1000 + CONTEXT, dtype=np.int32), 0, 1, GREEDY)
        scheduler.target.finish_verify(1)
        yield scheduler.target, VOCABS[request.param]


def _round_trip(link, sampling, worker_s: list[float]):
    link.start_verify(1, 0, np.arange(2000, 2000 + ROWS, dtype=np.int32), CONTEXT, ROWS, sampling)
    result = link.finish_verify(ROWS)
    worker_s.append(result.seconds)
    return result.choice if result.probs is None else np.array(result.probs)   # the scheduler reads every row


def test_ipc_round_trip_token_window(benchmark, link):
    link, vocab = link
    worker_s = []
    choice = benchmark(_round_trip, link, GREEDY, worker_s)
    assert len(choice) == ROWS and all(0 <= t < vocab for t in choice)
    beside_the_model(benchmark, worker_s, tokens=ROWS, vocab=vocab)


def test_ipc_round_trip_probability_rows(benchmark, link):
    link, vocab = link
    worker_s = []
    probs = benchmark(_round_trip, link, Sampling(Rule.UNKEYED, 0.7, 0, 0.9, 1), worker_s)
    assert probs.shape == (ROWS, vocab)
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-3)
    beside_the_model(benchmark, worker_s, rows=ROWS, vocab=vocab, megabytes=ROWS * vocab * 4 / 2**20)
