"""The target decodes ahead in mode target (Decoder.ahead, TargetLink.ran_ahead): each
step after the first is answered by a token it decoded unasked. The output stays the
target's own; a run that outlives its request (a stop string, the token limit, a
cancelled stream) is stopped, and what it still sends is dropped, so the next request
is exact too."""
import pytest

import hetspec

from helpers import TARGET, load_reference, random_engine_config, reference_greedy

PROMPTS = [[1, 2, 3, 4, 5], list(range(100, 140))]


@pytest.fixture(scope="module")
def engine():
    with hetspec.launch(random_engine_config()) as engine:
        yield engine


@pytest.fixture(scope="module")
def reference():
    return load_reference(TARGET)


def test_greedy_steps_come_from_the_run_ahead_and_equal_the_targets_own(engine, reference):
    for prompt in PROMPTS:
        result = engine.generate(prompt, max_new_tokens=40, mode="target")
        assert result.token_ids == reference_greedy(reference, prompt, 40)
        assert result.stats["ran_ahead"] >= 30, result.stats     # 39 steps after the first; a few may miss


def test_a_run_cut_short_leaves_the_next_requests_exact(engine, reference):
    expected = reference_greedy(reference, PROMPTS[0], 40)
    stop = engine.generate(PROMPTS[0], max_new_tokens=3, mode="target")   # the run goes on past the limit
    assert stop.token_ids == expected[:3]
    stream = engine.stream(PROMPTS[1], max_new_tokens=200, mode="target")
    next(stream)
    stream.close()                                                         # cancelled mid-run
    for prompt in PROMPTS:                                                 # stale tokens of both runs dropped
        assert engine.generate(prompt, max_new_tokens=40, mode="target").token_ids == \
            reference_greedy(reference, prompt, 40)
    again = engine.generate(PROMPTS[0], max_new_tokens=40, mode="duodec", gamma=3)
    assert again.token_ids == expected and again.stats["ran_ahead"] == 0


def test_seeded_sampling_runs_ahead_with_the_same_keyed_draws(engine):
    sampling = {"max_new_tokens": 30, "temperature": 0.9, "seed": 5}
    alone = engine.generate(PROMPTS[1], mode="target", **sampling)
    assert alone.stats["ran_ahead"] >= 20
    speculative = engine.generate(PROMPTS[1], mode="sequential", speculation="always", gamma=3, **sampling)
    assert speculative.token_ids == alone.token_ids
    unseeded = engine.generate(PROMPTS[1], mode="target", max_new_tokens=10, temperature=0.9)
    assert unseeded.stats["ran_ahead"] == 0      # the scheduler draws: no token to decode ahead
