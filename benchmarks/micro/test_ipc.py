"""One IPC round trip from the engine's TargetLink to the echo target (echo_workers.py: no compute): a greedy
window of gamma + 1 ids, and gamma + 1 vocabulary-sized probability rows that the scheduler reads in full."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import zmq

from hetspec.benchmarks.micro.conftest import GAMMA, VOCABS
from hetspec.benchmarks.micro.echo_workers import EchoSpec, command, echo_next
from hetspec.core.sampling import GREEDY, Rule, Sampling
from hetspec.ipc.channel import Channel, ipc_endpoint, make_runtime_dir
from hetspec.ipc.messages import WorkerHello
from hetspec.ipc.shm import new_run_id
from hetspec.scheduler.decoding.links import TargetLink

ROWS = GAMMA + 1

@pytest.fixture(scope="module", params=list(VOCABS), ids=lambda v: f"vocab-{v}")
def echo_link(request):
    vocab = VOCABS[request.param]
    runtime = make_runtime_dir(tempfile.mkdtemp(prefix="hetspec-bench-ipc-"))
    context = zmq.Context()
    link = TargetLink("target", Channel(context, ipc_endpoint(runtime, "echo"), bind=True))
    worker = subprocess.Popen([sys.executable, *command("target", link.channel.endpoint, EchoSpec(vocab=vocab))])
    try:
        hello = link.wait(60)
        assert isinstance(hello, WorkerHello), hello
        link.hello = hello
        link.attach(new_run_id(), {"input": ((4096,), np.int32), "choice": ((ROWS,), np.int32),
                                   "probs": ((ROWS, vocab), np.float32)})
        yield link, vocab
    finally:
        link.close()
        worker.wait(10)
        link.channel.close()
        context.term()
        shutil.rmtree(runtime, ignore_errors=True)


def _round_trip(link, window, sampling, read_probs):
    link.start_verify(1, 0, window, 100, ROWS, sampling)
    result = link.finish_verify(ROWS)
    if read_probs:
        return np.array(result.probs)      # the scheduler reads every row it was sent
    return result.choice


def test_ipc_round_trip_token_window(benchmark, echo_link):
    link, vocab = echo_link
    window = np.arange(ROWS, dtype=np.int32)
    benchmark.extra_info.update(tokens=ROWS, vocab=vocab)
    choice = benchmark(_round_trip, link, window, GREEDY, False)
    assert list(choice) == list(echo_next(window, vocab))


def test_ipc_round_trip_probability_rows(benchmark, echo_link):
    link, vocab = echo_link
    window = np.arange(ROWS, dtype=np.int32)
    benchmark.extra_info.update(rows=ROWS, vocab=vocab, megabytes=ROWS * vocab * 4 / 2**20)
    probs = benchmark(_round_trip, link, window, Sampling(Rule.UNKEYED, 0.7, 0, 0.9, 1), True)
    assert probs.shape == (ROWS, vocab)
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-3)
