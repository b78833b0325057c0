"""The halt flag (DraftLink.halt): a real native draft worker process growing its
likeliest branch after its reply stops midway through a step once the scheduler sets
the flag, takes the next command at once, and extends again after it; and an engine
whose native draft keeps drafting beside the native target is still exactly the
target's greedy output."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

import hetspec
from hetspec.core.sampling import GREEDY
from hetspec.ipc.channel import Channel, ipc_endpoint
from hetspec.ipc.messages import BranchPlan, Drafted, DraftExtended, WorkerHello
from hetspec.ipc.shm import new_run_id
from hetspec.ipc.specs import DraftSpec
from hetspec.models import resolve_model
from hetspec.scheduler.decoding.links import DraftLink

pytestmark = pytest.mark.integration

ROWS = 40          # tokens a slot: the likeliest branch may grow far beyond the window


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """A native SmolLM2 draft worker on this process's end of the link, with its buffers."""
    folder = tmp_path_factory.mktemp("halt")
    context = zmq.Context()
    endpoint = ipc_endpoint(str(folder), "draft")
    link = DraftLink("draft", Channel(context, endpoint, bind=True))
    spec = DraftSpec(backend="native", model=resolve_model("builtin:smollm2", "draft"),
                     cores=sorted(os.sched_getaffinity(0))[:1], threads=1, n_ctx=512, scratch_dir=str(folder))
    process = subprocess.Popen([sys.executable, "-m", "hetspec.workers.draft", "--endpoint", endpoint,
                                "--spec", spec.to_json()])
    try:
        link.hello = link.wait(120)
        assert isinstance(link.hello, WorkerHello) and link.hello.backend == "native", link.hello
        n_vocab = link.hello.n_vocab
        link.attach(new_run_id(), {"context": ((512,), np.int32), "tokens": ((2, ROWS), np.int32),
                                   "probs": ((2, ROWS, n_vocab), np.float32), "halt": ((1,), np.int32)})
        yield link
    finally:
        link.close()
        process.wait(30)
        link.channel.close()
        context.term()


def _window(link: DraftLink, context: list[int]) -> Drafted:
    """A pipelined window of 2 tokens that may grow to ROWS; its reply."""
    link.start_window(1, 0, context, 2, GREEDY, BranchPlan(1, 1, 0.8, extend_to=ROWS))
    reply = link.wait(30)
    assert isinstance(reply, Drafted)
    return reply


def _extensions(link: DraftLink, seconds: float) -> list[DraftExtended]:
    """The extensions that arrive within `seconds`."""
    got, end = [], time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        message = link.channel.recv(left)
        if message is not None:
            assert isinstance(message, DraftExtended), message
            got.append(message)
    return got


def test_the_flag_stops_an_extension_midway_and_the_next_window_clears_it(worker):
    context = [int(t) for t in np.random.default_rng(3).integers(10, 5000, 40)]
    _window(worker, context)
    first = worker.channel.recv(10)
    assert isinstance(first, DraftExtended)            # the likeliest branch grows...
    worker.halt()
    assert worker.buffers["halt"].array[0] == 1
    late = _extensions(worker, 0.5)                    # ...until the flag: a step under way is dropped
    assert len(late) <= 1, late                        # (one that ended as the flag went up may be sent)
    assert all(m.total < ROWS for m in [first, *late])
    reply = _window(worker, context + [5])             # the next window clears the flag
    assert worker.buffers["halt"].array[0] == 0 and reply.seconds < 5
    grown = _extensions(worker, 0.5)
    assert grown and grown[-1].command == worker.command
    worker.stop_background()


def test_an_engine_whose_native_draft_keeps_drafting_stays_exact():
    """The shipped pair (SmolLM2 twice, the native draft and target) with keep_drafting on:
    every pipelined round's extension is halted at the target's verdict. A fixed gamma:
    an automatic budget may find this draft, no faster than the target, worth no window
    at all (a 1-token W' that only guesses the bonus token), and then nothing is halted."""
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    config = {"decoding": {"keep_drafting": True, "lookup": 0, "gamma": 4}}
    with hetspec.launch(config) as engine:
        assert engine.info["keep_drafting"] is True and engine.info["draft"]["kernels"].startswith("native")
        want = engine.generate(messages=[{"role": "user", "content": prompt}], max_new_tokens=96, mode="target")
        got = engine.generate(messages=[{"role": "user", "content": prompt}], max_new_tokens=96, mode="duodec",
                              speculation="always")
    assert got.token_ids == want.token_ids
    stats = {k: got.stats[k] for k in ("spec_rounds", "drafted", "accepted", "target_only_rounds")}
    assert stats["spec_rounds"] > 0 and stats["accepted"] > 0, stats
