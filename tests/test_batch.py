"""Several requests in one target pass (scheduler/batch.py, VerifyBatch), and the draft's
windows for them (DraftBatch).

A real target worker answers a batch of windows, each in its own cache, exactly as it
answers each window alone (the native kernels; greedy, keyed and unkeyed rows); engines
step concurrent requests together and give each its output alone, read a joining prompt
in chunks beside the others' steps, and let one request leave a batch (cancelled, timed
out) without disturbing the rest. The native draft drafts a batch's windows as it drafts
each alone, and the default pair's concurrent requests keep their outputs with them."""
from __future__ import annotations

import os
import signal
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
from hetspec.ipc.specs import DraftSpec, TargetSpec
from hetspec.models import resolve_model
from hetspec.scheduler.decoding.budget import CostModel
from hetspec.scheduler.decoding.links import TargetLink, WorkerError
from hetspec.workers.draft.backends import load_draft_model
from hetspec.workers.draft.batch_drafter import BatchDrafter
from hetspec.workers.draft.drafter import Drafter

from helpers import random_engine_config

ROWS, N_CTX = 16, 256
KEYED, UNKEYED = Sampling(Rule.KEYED, 0.8, seed=5), Sampling(Rule.UNKEYED, 0.9, top_k=50)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A real native SmolLM2 target worker process with 3 caches, on this process's end of a
    TargetLink (the transformers target's packed pass: tests/test_packed_pass.py, and the
    engine tests below, on random models)."""
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


@pytest.mark.parametrize("passes", ["static", "captured"])
def test_a_static_cache_target_steps_a_batch_in_one_pass_each_output_alone(passes):
    """The transformers target's static passes packed into one (packed_pass.py), or its captured
    passes' recorded batch pass (captured.py), in an engine on a Gemma 3 past its sliding
    window, greedy and keyed."""
    config = random_engine_config(target="random:arch=gemma3,seed=0", draft="random:arch=gemma3,seed=0")
    config["target"]["passes"] = passes
    requests = REQUESTS[:2] + [("Fourth, sampled", {"max_new_tokens": 30, "temperature": 0.8, "seed": 7})]
    with hetspec.launch(config) as engine:
        alone = [engine.generate(prompt, **params) for prompt, params in requests]
        together = run_all(engine, requests)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert sum(r.stats["batched_rounds"] for r in together) > 0


# ---- a batch's drafts (Drafts, workers/draft/batch_drafter.py) -------------------------------

@pytest.fixture(scope="module")
def native_draft():
    """SmolLM2's native draft model, as the default pair's draft worker loads it."""
    spec = DraftSpec(backend="native", model=resolve_model("builtin:smollm2", "draft"), cores=[0], threads=1,
                     n_ctx=N_CTX, weights="q4_1")
    model, backend, _ = load_draft_model(spec)
    assert backend == "native"
    yield model
    model.close()


def test_a_batch_drafts_each_request_as_it_drafts_it_alone(native_draft):
    """Each window's tokens do not depend on the others in the batch (the batch-invariant
    window kernels), greedy and keyed; a cache kept from a step before, caught up by
    longest common prefix, drafts what a fresh cache does; a far-behind cache catches up
    `catch_up` tokens a call and drafts nothing until it holds its context."""
    rng = np.random.default_rng(3)
    contexts = [rng.integers(1, 2000, n).astype(np.int32) for n in (40, 9, 25)]
    samplings = [GREEDY, KEYED, GREEDY]
    together = BatchDrafter(Drafter(native_draft, N_CTX, 3))
    tokens, lengths, cached = together.draft([(c, contexts[c], samplings[c]) for c in range(3)], 5, 64)
    assert lengths == [5, 5, 5] and cached == [40, 9, 25]
    for c in range(3):
        alone = BatchDrafter(Drafter(native_draft, N_CTX, 4)).draft([(3, contexts[c], samplings[c])], 5, 64)[0]
        np.testing.assert_array_equal(tokens[c], alone[0])
    # the next step: two accepted, a bonus token of the target's own, and a rollback in cache 2
    later = [np.concatenate([contexts[0], tokens[0, :2], [7]]), np.concatenate([contexts[1], [11]]),
             contexts[2][:20]]
    again = together.draft([(c, later[c], samplings[c]) for c in range(3)], 4, 64)[0]
    fresh = BatchDrafter(Drafter(native_draft, N_CTX, 3)).draft([(c, later[c], samplings[c]) for c in range(3)], 4, 64)[0]
    np.testing.assert_array_equal(again, fresh)
    slow = BatchDrafter(Drafter(native_draft, N_CTX, 1))
    assert slow.draft([(0, later[0], GREEDY)], 3, 16)[1:] == ([0], [16])
    assert slow.draft([(0, later[0], GREEDY)], 3, 16)[1:] == ([0], [32])
    np.testing.assert_array_equal(slow.draft([(0, later[0], GREEDY)], 4, 16)[0][0], fresh[0])


def test_a_request_drafts_alone_and_in_a_batch_in_one_cache_of_its_own(native_draft):
    """A request's draft cache is the same alone and in a batch (Drafter.use): a lone
    window starts from what the batch left there, and drafting alone in one cache leaves
    the others as they were (a batch step in another drafts what a fresh cache does)."""
    rng = np.random.default_rng(5)
    contexts = [rng.integers(1, 2000, 30).astype(np.int32) for _ in range(2)]
    drafter = Drafter(native_draft, N_CTX, 2)
    batch = BatchDrafter(drafter)
    tokens = batch.draft([(c, contexts[c], GREEDY) for c in range(2)], 3, 64)[0]
    assert drafter.lengths == [32, 32]                  # each context, and its window but the last token
    drafter.use(1)
    grown = np.concatenate([contexts[1], tokens[1, :1], [5]])
    np.testing.assert_array_equal(drafter.held(1)[:31], grown[:31])
    drafter.draft(grown, 4, GREEDY)
    assert drafter.lengths == [32, len(grown) + 3]
    later = np.concatenate([contexts[0], tokens[0, :2], [7]])
    again = batch.draft([(0, later, GREEDY)], 4, 64)[0]
    fresh = BatchDrafter(Drafter(native_draft, N_CTX, 1)).draft([(0, later, GREEDY)], 4, 64)[0]
    np.testing.assert_array_equal(again, fresh)


def test_a_batch_window_shrinks_as_the_batch_pass_stops_being_free():
    """The cost model's window for a batch: drafting pays where the pass is flat (a GPU) and
    the batch small; as the pass grows with its tokens (a CPU), or the batch's draft steps
    grow, the window shrinks, down to none unless forced."""
    flat = CostModel(0.01, {1: 0.04, 32: 0.04})
    flat.batch_draft_s = {1: 0.01, 2: 0.013, 4: 0.024, 8: 0.05}
    windows = [flat.batch_window([0.9] * n, [1.0] * n, [], 8) for n in (1, 2, 4, 8)]
    assert windows[0] >= 2 and windows == sorted(windows, reverse=True) and windows[-1] == 0
    # steps without drafts that commit three tokens each with their lookup guesses: drafting for 2 no longer pays
    assert flat.batch_window([0.9] * 2, [1.0] * 2, [], 8) > 0 == flat.batch_window([0.9] * 2, [3.0] * 2, [], 8)
    steep = CostModel(0.01, {1: 0.01, 2: 0.02, 8: 0.08})
    steep.batch_draft_s = {1: 0.01, 4: 0.024}
    assert steep.batch_window([0.9] * 4, [1.0] * 4, [], 8) == 0
    assert steep.batch_window([0.9] * 4, [1.0] * 4, [], 8, forced=True) == 2


def test_the_default_pair_drafts_for_concurrent_requests_each_with_its_output_alone():
    """The default pair (native SmolLM2 draft and target), speculation forced: concurrent
    requests step together with a window drafted for each (greedy and keyed), and each
    request's output is its output alone; so too when the draft is killed while they step
    (its batch under way is lost: they step on with their lookup guesses)."""
    requests = [(p, {"max_new_tokens": 24, "speculation": "always", **extra})
                for p, extra in [("def fibonacci(n):", {}), ("The capital of France is", {}),
                                 ("Once upon a time", {"temperature": 0.8, "seed": 3})]]
    with hetspec.launch("smollm2") as engine:
        info = engine.get_info()
        assert info["batch_drafts"] is True
        assert info["config"]["server"]["max_running"] == 4          # "auto" on a CPU target
        alone = [engine.generate(prompt, **params) for prompt, params in requests]
        together = run_all(engine, requests)
        assert [r.token_ids for r in together] == [r.token_ids for r in alone]
        assert sum(r.stats["batched_rounds"] for r in together) > 0
        assert sum(r.stats["spec_rounds"] for r in together if r.stats["batched_rounds"]) > 0
        long = [(prompt, {**params, "max_new_tokens": 200}) for prompt, params in requests]
        expected = [engine.generate(prompt, **params).token_ids for prompt, params in long]
        streams = [engine.stream(prompt, **params) for prompt, params in long]
        next(streams[0])
        os.kill(engine.get_info()["draft"]["pid"], signal.SIGKILL)
        assert [list(s) and s.result.token_ids for s in streams] == expected
