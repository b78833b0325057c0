"""A draft that never agrees must not make the engine slower than the target
alone (scheduler/decoding/gate.py): the engine's own counters show it resting, and a
forced request still speculates. Output stays exact either way."""
import pytest

import hetspec

from helpers import WEAK_DRAFT, load_reference, random_engine_config, reference_greedy

PROMPT = [5, 9, 17, 33]
N_NEW = 160


@pytest.fixture(scope="module")
def engine():
    with hetspec.launch(random_engine_config(draft=WEAK_DRAFT, speculation="auto")) as engine:
        yield engine


def test_a_draft_that_never_agrees_leaves_the_target_alone(engine):
    expected = reference_greedy(load_reference("random:seed=0"), PROMPT, N_NEW)
    first = engine.generate(PROMPT, max_new_tokens=N_NEW)
    second = engine.generate(PROMPT, max_new_tokens=N_NEW)
    other = engine.generate(PROMPT, max_new_tokens=N_NEW, mode="sequential")
    assert first.token_ids == second.token_ids == other.token_ids == expected
    assert first.stats["accepted"] <= 0.1 * first.stats["drafted"]       # it really never agrees
    # The first request finds out within a few rounds and probes less and less often;
    # the next one of its mode starts where it left off.
    assert first.stats["rested"] >= 0.6 * N_NEW and first.stats["probes"] >= 1
    assert second.stats["rested"] >= 0.9 * N_NEW
    assert second.stats["spec_rounds"] <= 0.05 * N_NEW
    # SpS has its own memory: it finds out for itself, from its first rounds.
    assert other.stats["spec_rounds"] >= 4 and other.stats["rested"] >= 0.6 * N_NEW


def test_forced_speculation_never_rests(engine):
    result = engine.generate(PROMPT, max_new_tokens=40, speculation="always")
    assert result.stats["rested"] == 0 and result.stats["spec_rounds"] >= 30
