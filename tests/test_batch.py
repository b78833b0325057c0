"""Several requests in one target pass (scheduler/batch.py, VerifyBatch).

A real target worker answers a batch of windows, each in its own cache, exactly as it
answers each window alone (the native kernels; greedy, keyed and unkeyed rows); engines step concurrent requests together and give each its output alone,
read a joining prompt in chunks beside the others' steps, and let one request leave a
batch (cancelled, timed out) without disturbing the rest."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import zmq
from test_turns import run_all

import hetspec
from hetspec.core.sampling import GREEDY, Rule, Sampling
from hetspec.ipc.channel import Channel, ipc_endpoint
from hetspec.ipc.messages import VerifyCommand, WorkerHello
from hetspec.ipc.shm import new_run_id
from hetspec.ipc.specs import TargetSpec
from hetspec.models import resolve_model
from hetspec.scheduler.decoding.links import TargetLink, WorkerError

from helpers import random_engine_config

ROWS, N_CTX = 16, 256
KEYED, UNKEYED = Sampling(Rule.KEYED, 0.8, seed=5), Sampling(Rule.UNKEYED, 0.9, top_k=50)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A real native SmolLM2 target worker process with 3 caches, on this process's end of a
    TargetLink (a transformers target runs a batch's windows one after another: the engine
    tests below, on random models, run it)."""
    folder = tmp_path_factory.mktemp("batch")
    model = resolve_model("builtin:smollm2", "target")
    context = zmq.Context()
    endpoint = ipc_endpoint(str(folder), "target")
    link = TargetLink("target", Channel(context, endpoint, bind=True))
    spec = TargetSpec(model=model, dtype="float32", device="cpu", cores=sorted(os.sched_getaffinity(0))[:1],
                      threads=1, backend="native", n_ctx=N_CTX, caches=3)
    process = subprocess.Popen([sys.executable, "-m", "hetspec.workers.target", "--endpoint", endpoint,
                                "--spec", spec.to_json()])
    try:
        link.hello = link.wait(120)
        assert isinstance(link.hello, WorkerHello) and link.hello.backend == "native", link.hello
        link.attach(new_run_id(), {"input": ((N_CTX,), np.int32), "choice": ((ROWS,), np.int32),
                                   "probs": ((ROWS, link.hello.n_vocab), np.float32)})
        yield link
    finally:
        link.close()
        process.wait(30)
        link.channel.close()
        context.term()


def _alone(link: TargetLink, cache: int, tokens, keep: int, rows: int, sampling: Sampling):
    link.start_verify(1, cache, np.asarray(tokens, np.int32), keep, rows, sampling)
    verdict = link.finish_verify(rows)
    return verdict.choice, None if verdict.probs is None else verdict.probs.copy()


def _batch(link: TargetLink, windows):
    """windows: (cache, tokens, keep, rows, sampling) each; each one's (choice, probs)."""
    commands = [VerifyCommand(i, keep, len(tokens), rows, s, cache=cache)
                for i, (cache, tokens, keep, rows, s) in enumerate(windows)]
    link.start_batch(commands, [np.asarray(w[1], np.int32) for w in windows], borrow_cores=False)
    return [(v.choice, None if v.probs is None else v.probs.copy()) for v in link.finish_batch()]


def test_a_batch_answers_each_window_as_it_is_answered_alone(target):
    rng, top = np.random.default_rng(0), min(2000, target.hello.n_vocab)
    prompts = [rng.integers(1, top, n) for n in (30, 7, 19)]
    samplings = [GREEDY, KEYED, UNKEYED]
    steps = [  # per cache: (tokens after how many cached, rows), a rollback in the second step
        [(prompts[0], 0, 1), (prompts[1], 0, 1), (prompts[2], 0, 1)],
        [(rng.integers(1, top, 5), 30, 5), (rng.integers(1, top, 1), 7, 1), (rng.integers(1, top, 3), 12, 2)],
        [(rng.integers(1, top, 2), 33, 2), (rng.integers(1, top, 4), 8, 4), (rng.integers(1, top, 1), 15, 1)],
    ]
    # each request's passes alone, in its own cache, one command each; then the same passes as batches
    alone = [[_alone(target, r, *step[r], samplings[r]) for r in range(3)] for step in steps]
    for step, answers in zip(steps, alone):
        together = _batch(target, [(r, *step[r], samplings[r]) for r in range(3)])
        for (choice, probs), (alone_choice, alone_probs), s in zip(together, answers, samplings):
            if s.rule is Rule.UNKEYED:
                np.testing.assert_array_equal(probs, alone_probs)
            else:
                np.testing.assert_array_equal(choice, alone_choice)


def test_a_batch_refuses_a_cache_twice_and_the_worker_serves_on(target):
    with pytest.raises(WorkerError, match="each cache once"):
        _batch(target, [(0, [5, 6], 0, 1, GREEDY), (0, [7], 0, 1, GREEDY)])
    assert _alone(target, 1, [5, 6, 7], 0, 1, GREEDY)[0].shape == (1,)


# ---- engines ----------------------------------------------------------------------

REQUESTS = [("The first", {"max_new_tokens": 40}),
            ("A second one", {"max_new_tokens": 30, "mode": "sequential"}),
            ("Third", {"max_new_tokens": 35, "mode": "target"}),
            ("Fourth, sampled", {"max_new_tokens": 30, "temperature": 0.8, "top_p": 0.9, "seed": 7})]


@pytest.fixture(scope="module")
def engine():
    """One engine for the tests below: random models, lookup on, a step holding 8 tokens."""
    config = random_engine_config(lookup=4)
    config["server"] = {"batch_tokens": 8}
    with hetspec.launch(config) as engine:
        yield engine


def test_concurrent_requests_step_together_each_with_its_output_alone(engine):
    alone = [engine.generate(prompt, **params) for prompt, params in REQUESTS]
    together = run_all(engine, REQUESTS)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert sum(r.stats["batched_rounds"] for r in together) > 0
    assert all(r.stats["batched_rounds"] == 0 for r in alone)


def test_a_joining_prompt_is_read_in_chunks_beside_the_running_request(engine):
    """batch_tokens 8: a 150-token prompt joins a decoding request and takes many steps to
    read, in each of which the running request decodes a token."""
    long_prompt = " ".join(["word"] * 150)
    expected = [engine.generate("Hello", max_new_tokens=300, mode="target").token_ids,
                engine.generate(long_prompt, max_new_tokens=4).token_ids]
    running = engine.stream("Hello", max_new_tokens=300, mode="target")
    next(running)
    joined = engine.generate(long_prompt, max_new_tokens=4)
    list(running)
    assert [running.result.token_ids, joined.token_ids] == expected
    n_prompt = joined.stats["prompt_tokens"]
    assert n_prompt >= 150 and running.result.stats["batched_rounds"] >= n_prompt // 8


def test_a_request_leaves_the_batch_without_disturbing_the_others(engine):
    expected = [engine.generate(p, max_new_tokens=60, mode="target").token_ids for p in ("one", "two")]
    streams = [engine.stream(p, max_new_tokens=60, mode="target") for p in ("one", "two")]
    leaving = engine.stream("three", max_new_tokens=2000, mode="target")
    timed = engine.generate("four", max_new_tokens=2000, mode="target", timeout_s=1.0)
    next(leaving)
    engine.cancel(leaving.request_id)
    list(leaving)
    assert leaving.result.finish_reason == "cancelled" and timed.finish_reason == "timeout"
    assert [list(s) and s.result.token_ids for s in streams] == expected
    assert max(s.result.stats["batched_rounds"] for s in streams) > 0
