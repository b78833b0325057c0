"""A draft that never agrees must not make the engine slower than the target
alone (scheduler/decoding/gate.py): the gate's policy alone, with a fake clock; then
the engine's own counters show it resting, and a forced request still speculates.
Output stays exact either way."""
import pytest

import hetspec
from hetspec.scheduler.decoding.gate import FIRST_REST, MAX_PROBE_REST, MIN_ROUNDS, PROBE_SHARE, RECENT, Gate, Memory

from helpers import WEAK_DRAFT, load_reference, random_engine_config, reference_greedy

PROMPT = [5, 9, 17, 33]
N_NEW = 160


def _judged(gate, rounds, seconds, committed):
    for _ in range(rounds):
        gate.judge(seconds, committed)


def _probing(memory):
    """A request's gate as it begins: its first rounds are a probe (Gate.start)."""
    gate = Gate(memory, forced=False)
    gate.start()
    return gate


def test_gate_rests_while_speculation_does_not_pay_and_probes_again():
    memory = Memory(target_s=0.010)
    gate = _probing(memory)
    _judged(gate, 1 + RECENT, 0.012, 1)              # 12 ms a token against 10 alone: rest
    assert not gate.speculate and gate.rest == FIRST_REST and memory.rest == FIRST_REST
    for _ in range(FIRST_REST):
        gate.rested(0.010, 1)
    assert gate.speculate                            # the probe
    _judged(gate, 1 + RECENT, 0.012, 1)
    assert gate.rest == 2 * FIRST_REST               # a failed probe doubles the rest
    nxt = Gate(memory, forced=False)
    assert not nxt.speculate and nxt.rest == 2 * FIRST_REST   # the next request inherits it
    for _ in range(nxt.rest):
        nxt.rested(0.010, 1)
    _judged(nxt, 1 + RECENT, 0.012, 3)               # 4 ms a token: pays
    assert nxt.speculate and memory.rest_len == FIRST_REST


def test_a_costly_failed_probe_buys_a_rest_it_is_a_small_share_of():
    """A probe whose draft catches up for 100 ms (the target committing 5 tokens beside
    it at 10 ms a token alone) and then runs 4 rounds of 12 ms a token loses about
    0.06 s: the rest after it is 0.06 s / (PROBE_SHARE * 10 ms) tokens, not merely doubled."""
    now = [0.0]
    memory = Memory(target_s=0.010)
    gate = Gate(memory, forced=False, clock=lambda: now[0])
    _judged(gate, 1 + RECENT, 0.012, 1)              # the first verdict: no probe to pay back
    assert gate.rest == FIRST_REST
    for _ in range(FIRST_REST):
        gate.rested(0.010, 1)
    now[0] += 0.100                                  # the draft catches up...
    gate.probing(5)                                  # ...the target alone committing 5 tokens meanwhile
    for _ in range(1 + RECENT):
        now[0] += 0.012
        gate.judge(0.012, 1)
    lost = 0.100 + (1 + RECENT) * 0.012 - (6 + RECENT) * 0.010
    assert gate.rest == pytest.approx(lost / (PROBE_SHARE * 0.010), abs=1) and gate.rest > 2 * FIRST_REST
    assert memory.rest == gate.rest                  # the next request inherits it
    for _ in range(gate.rest):                       # a probe that loses an hour is capped
        gate.rested(0.010, 1)
    now[0] += 3600
    _judged(gate, 1 + RECENT, 0.012, 1)
    assert gate.rest == MAX_PROBE_REST


def test_a_request_that_begins_by_speculating_pays_back_its_first_probe():
    """Each request of an engine whose draft cannot pay begins with a probe (its rest
    over): timed from the prompt on (Gate.start), a failed one buys the rest it cost,
    not merely FIRST_REST, so the requests after it rest rather than probe again."""
    now = [0.0]
    memory = Memory(target_s=0.010)
    gate = Gate(memory, forced=False, clock=lambda: now[0])
    gate.start()
    now[0] += 0.100
    gate.probing(5)                                  # the target alone beside the draft's catching up
    for _ in range(1 + RECENT):
        now[0] += 0.012
        gate.judge(0.012, 1)
    lost = 0.100 + (1 + RECENT) * 0.012 - (6 + RECENT) * 0.010
    assert gate.rest == pytest.approx(lost / (PROBE_SHARE * 0.010), abs=1)
    assert gate.rest > 2 * FIRST_REST and memory.rest == gate.rest
    forced = Gate(Memory(target_s=0.010), forced=True, clock=lambda: now[0])
    forced.start()
    assert forced.probe_began is None


def test_rounds_of_one_token_never_pay_against_a_target_timed_slow():
    """A target alone timed at a slow moment (50 ms a token) is never timed again while
    a request speculates: rounds that commit one token each rest all the same, and a
    draft that is accepted at all is judged by the clock."""
    memory = Memory(target_s=0.050)
    gate = _probing(memory)
    _judged(gate, 1 + RECENT, 0.012, 1)
    assert not gate.speculate and gate.rest == FIRST_REST
    accepted = _probing(Memory(target_s=0.050))
    _judged(accepted, 1 + RECENT, 0.024, 2)
    assert accepted.speculate and accepted.probe_began is None   # the probe paid
    _judged(accepted, RECENT, 0.012, 1)              # then a stint of one-token rounds
    assert not accepted.speculate


def test_a_few_bad_rounds_are_chance_a_steady_loss_is_not():
    """A round commits 1 token or many: the gate rests where its stint is slower on average, or its last rounds lose
    beyond one standard error of their mean gain, not for a bad patch in a stint that pays. A steady loss rests it."""
    gate = _probing(Memory(target_s=0.010))
    _judged(gate, 1 + RECENT, 0.020, 4)              # 5 ms a token against 10 alone
    for committed in [6, 1, 1, 1, 1, 1, 1, 1]:       # at last 3.75 ms lost a round on average, its standard error 6.25
        gate.judge(0.020, committed)
        assert gate.speculate
    assert gate.probe_began is None                  # the probe paid
    rounds = 0
    while gate.speculate and rounds < RECENT:        # 10.5 ms a token, every round alike: rest
        gate.judge(0.021, 2)
        rounds += 1
    assert not gate.speculate and gate.rest == FIRST_REST
    noisy = _probing(Memory(target_s=0.010))         # 1 ms lost a round on average, its standard error 5 ms:
    for i in range(1 + 2 * RECENT):                  # the stint, slower on average, rests once its mean is sure
        assert noisy.speculate
        noisy.judge(0.021, 1 + 2 * (i % 2))
    assert not noisy.speculate


def test_gate_never_rests_a_forced_request_and_times_the_target_first():
    forced = Gate(Memory(target_s=0.010), forced=True)
    _judged(forced, 20, 1.0, 1)
    assert forced.speculate
    unknown = Gate(Memory(target_s=None), forced=False)
    _judged(unknown, 1 + MIN_ROUNDS, 0.001, 5)
    assert unknown.rest == MIN_ROUNDS                # nothing to compare with yet: time the target alone



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
    assert second.stats["spec_rounds"] <= 1 + RECENT                    # one probe at most
    # SpS has its own memory: it finds out for itself, from its first rounds.
    assert other.stats["spec_rounds"] >= 4 and other.stats["rested"] >= 0.6 * N_NEW


def test_forced_speculation_never_rests(engine):
    result = engine.generate(PROMPT, max_new_tokens=40, speculation="always")
    assert result.stats["rested"] == 0 and result.stats["spec_rounds"] >= 30
