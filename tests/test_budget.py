"""The cost model and the windows it sets: each round's gamma, restarts, lookup guesses,
whether a draft prefill (or drafting at all) pays, and the acceptance estimate they weigh."""
import dataclasses

import pytest

from hetspec.core.params import SamplingParams, Speculation
from hetspec.core.sampling import Rule, Sampling
from hetspec.scheduler.decoding.acceptance_prior import AcceptancePrior
from hetspec.scheduler.decoding.budget import (
    CostModel,
    Windows,
    choose_gamma,
    interpolate,
    monotone,
)
from hetspec.scheduler.decoding.decoder import Decoder
from hetspec.scheduler.decoding.output import Output
from hetspec.scheduler.decoding.request import Capabilities, Request
from hetspec.scheduler.decoding.stats import Stats


def test_gamma_balances_draft_against_verify():
    verify = {1: 0.040, 8: 0.060, 16: 0.100}
    # 7.4 ms per draft token: 9 * 7.4 = 66.6 ms >= verify(9) = 65 ms, while 8 * 7.4 = 59.2 ms < verify(8) = 60 ms
    gamma = choose_gamma(0.0074, verify, 32)
    assert gamma * 0.0074 >= interpolate(verify, gamma)
    assert (gamma - 1) * 0.0074 < interpolate(verify, gamma - 1)
    assert gamma == 9


def test_gamma_caps_and_slow_draft():
    assert choose_gamma(1e-6, {1: 1.0, 2: 1.0}, 12) == 12     # draft never catches up: the cap
    assert choose_gamma(10.0, {1: 0.01, 2: 0.02}, 12) == 1     # draft slower than any verify
    with pytest.raises(ValueError):
        choose_gamma(0.0, {1: 0.1}, 8)


def test_verify_timings_made_monotone():
    measured = {1: 0.069, 2: 0.069, 4: 0.072, 6: 0.055, 8: 0.062, 12: 0.060, 16: 0.084}
    assert monotone(measured) == {1: 0.055, 2: 0.055, 4: 0.055, 6: 0.055, 8: 0.060, 12: 0.060, 16: 0.084}
    assert monotone({1: 0.04, 8: 0.06}) == {1: 0.04, 8: 0.06}


def test_interpolate_between_and_beyond():
    points = {1: 1.0, 3: 3.0}
    assert interpolate(points, 2) == pytest.approx(2.0)
    assert interpolate(points, 5) == pytest.approx(5.0)
    assert interpolate({4: 2.0}, 9) == 2.0


def test_round_draft_length_follows_the_verify_it_overlaps():
    costs = CostModel(0.010, {1: 0.040, 8: 0.075, 16: 0.115})
    assert costs.covering(12, pending=7) == 8            # verify of 8 tokens: 75 ms = 7.5 draft tokens
    assert costs.covering(12, pending=0) == 4            # after a rejection: a short draft, no idle target
    assert costs.covering(6, pending=15) == 6            # never above gamma
    fixed = Windows(12, rebalance=False, max_gamma=32, costs=costs)
    assert fixed.pipelined(7, 0.9, room=100) == 8 and fixed.pipelined(7, 0.9, room=3) == 3   # room caps it
    for _ in range(50):                                  # the machine got twice as slow at verifying
        costs.observe(8, 0.080, 8, 0.150)
    assert costs.covering(32, pending=0) == 8


def test_a_lookup_guess_is_as_long_as_it_pays():
    # A window of 1 + k tokens commits 1 + a + ... + a**k: at 80% the guess of least time per
    # token is 3 (4.23 ms a token; 4.65 at 4), at 2% none (a second token costs more than it gains).
    costs = CostModel(0.010, {1: 0.010, 2: 0.0105, 4: 0.0125, 8: 0.025})
    assert Windows(4, False, 32, costs, max_lookup=8).lookup(0.8, room=100) == 3
    assert Windows(4, False, 32, costs, max_lookup=8).lookup(0.02, room=100) == 0
    assert Windows(4, False, 32, costs, max_lookup=2).lookup(0.8, room=100) == 2      # the config's cap
    assert Windows(4, False, 32, costs, max_lookup=8).lookup(0.8, room=1) == 1        # room
    assert Windows(4, False, 32, costs, max_lookup=0).lookup(0.99, room=100) == 0     # lookup off
    # without costs (a configured gamma): each guessed token kept at least 10% of the time
    assert [Windows(4, False, 32, None, max_lookup=4).lookup(a, room=100) for a in (1.0, 0.8, 0.5, 0.3, 0.05)] == \
        [4, 4, 3, 1, 0]


def test_a_guess_after_a_window_fills_a_flat_pass_and_pays_its_way_on_a_growing_one():
    """After a round's window of 4 drafted tokens (kept whole at 0.8 ** 4), the draft drafting 4 beside the pass: on a
    flat pass (a GPU's, up to 16 tokens) the guess takes every free row; where each token costs the pass more, it
    shrinks with the window's chance of being kept whole and the guess's hit rate, unless the draft beside takes
    longer than the pass anyway (gamma 2: 20 ms)."""
    flat = CostModel(0.010, {1: 0.040, 16: 0.040, 32: 0.080})
    assert Windows(4, False, 32, flat, max_lookup=16).lookup(0.3, 100, pending=4, acceptance=0.8, gamma=4) == 11
    growing = CostModel(0.010, {1: 0.010, 8: 0.012, 16: 0.020, 32: 0.040})   # the draft beside: 10 ms (gamma 1)
    after = [Windows(4, False, 32, growing, max_lookup=16).lookup(h, 100, pending=4, acceptance=a, gamma=1)
             for a, h in ((0.9, 0.9), (0.9, 0.5), (0.3, 0.3))]
    assert after == [3, 2, 0]
    assert Windows(4, False, 32, growing, max_lookup=16).lookup(0.3, 100, pending=4, acceptance=0.3, gamma=2) == 11
    # with no window it is a target-only step's guess, the draft idle beside it
    assert Windows(4, False, 32, growing, max_lookup=8).lookup(0.8, 100, pending=0) == \
        Windows(4, False, 32, growing, max_lookup=8).lookup(0.8, 100)


def test_restart_drafts_while_a_token_beats_the_pipelines_pace():
    # 16 ms per committed token in the pipeline, 10 ms a draft step: worth it while 0.95**j >= 0.625.
    costs = CostModel(0.010, {1: 0.040, 8: 0.075})
    assert Windows(33, False, 32, costs).restart(0.95, 0.016, room=100) == 9
    assert Windows(5, False, 32, costs).restart(0.95, 0.016, room=100) == 4    # at most a pipelined window
    assert Windows(5, False, 32, costs).restart(0.6, 0.016, room=100) == 0     # 0.6 < 0.625: verify alone
    assert Windows(5, False, 32, CostModel(0.020, costs.verify_s)).restart(0.99, 0.016, room=100) == 0  # slow draft
    assert Windows(5, False, 32, costs).restart(0.95, 0.016, room=0) == 0
    assert Windows(5, False, 32, None).restart(0.1, None, room=100) == 4       # no cost model: a full window


def test_pipeline_pace_from_the_cost_model():
    costs = CostModel(0.010, {1: 0.040, 8: 0.075})
    # gamma 4: the round lasts max(4 x 10 ms, verify of 4 = 55 ms); 1 + .5 + .25 + .125 tokens.
    assert costs.s_per_token(4, 0.5) == pytest.approx(0.055 / 1.875)
    # gamma 8: drafting (80 ms) outlasts verifying (75 ms); every token accepted.
    assert costs.s_per_token(8, 1.0) == pytest.approx(0.080 / 8)


def test_sps_gamma_minimises_time_per_token():
    # The quick report's calibration: 4.6 ms a draft step; verify ms by pass size.
    verify = {n: t / 1000 for n, t in {1: 14, 2: 16, 4: 18, 6: 21, 8: 25, 10: 50, 16: 56, 32: 76}.items()}
    assert choose_gamma(0.0046, verify, 32) == 4                # the pipelined balance point
    # At 99% acceptance SpS drafts longer: 7 tokens, a pass of 8 (25 ms) before the costly sizes.
    costs = CostModel(0.0046, verify)
    assert costs.best_sequential(32, 0.99) == 7
    assert costs.best_sequential(32, 0.6) == 1                  # most of a long window would be lost
    gammas = [costs.best_sequential(32, a) for a in (0.5, 0.7, 0.9, 0.95, 0.99)]
    assert gammas == sorted(gammas)
    assert costs.best_sequential(5, 0.99) == 5                  # never above the cap
    assert Windows(4, rebalance=True, max_gamma=32, costs=costs).sequential(0.99, room=100) == 7
    assert Windows(4, rebalance=False, max_gamma=32, costs=costs).sequential(0.99, room=100) == 4   # fixed
    assert costs.best_sequential(32, 0.9) == 3
    for _ in range(50):                                         # the target got twice as slow
        costs.observe(4, 4 * 0.0046, 5, 2 * interpolate(verify, 5))
    assert costs.best_sequential(32, 0.9) == 5                  # each pass is worth more tokens


def test_acceptance_prior_learns_from_earlier_requests_of_its_kind():
    greedy = Request(0, SamplingParams(mode="sequential", seed=1), Sampling(Rule.GREEDY), 4, 1, rebalance=False)
    unkeyed = Request(0, SamplingParams(temperature=0.7, top_p=0.9), Sampling(Rule.UNKEYED, 0.7, 0, 0.9, 1), 4, 1,
                      rebalance=False)
    keyed = dataclasses.replace(unkeyed, sampling=Sampling(Rule.KEYED, 0.7, 0, 0.9, 1))
    history = AcceptancePrior()
    assert history.prior(greedy) == 0.8                      # nothing seen yet
    history.learn(greedy, Stats(accepted=200, rejections=2))  # 99% of 202 tokens
    assert 0.95 < history.prior(greedy) <= 0.99
    for _ in range(20):
        history.learn(greedy, Stats(accepted=500, rejections=0))
    assert history.prior(greedy) == 0.99                     # never certainty
    assert Stats(prior=0.99).acceptance == pytest.approx(0.99)
    assert history.prior(unkeyed) == history.prior(keyed) == 0.8   # each sampling rule keeps its own history
    history.learn(keyed, Stats(accepted=10, rejections=90))
    assert history.prior(keyed) < 0.8 == history.prior(unkeyed)


def test_pipelined_window_shortens_where_long_verifies_cost_much():
    """A CPU target with a large output layer (verify grows steeply with the window) and
    modest acceptance: a short window commits nearly as much for far less. Where a
    window costs the target little more, the pipelined window stays at the balance point."""
    steep = CostModel(0.014, {1: 0.106, 4: 0.130, 8: 0.182, 16: 0.269, 32: 0.426})
    assert 3 <= steep.best_pipelined(32, 0.7) <= 6
    flat = CostModel(0.004, {1: 0.030, 8: 0.032, 16: 0.036, 32: 0.045})
    assert flat.best_pipelined(32, 0.99) == choose_gamma(0.004, flat.verify_s, 32)


def test_gain_says_when_speculating_pays_for_a_waiting_target():
    """The draft's prefill borrows the target's cores, the target waiting, only where
    speculation more than doubles the pace (Decoder.draft_catches_up)."""
    steep = CostModel(0.014, {1: 0.106, 4: 0.130, 8: 0.182, 16: 0.269, 32: 0.426})
    assert steep.gain(32, 0.0) <= 1 < steep.gain(32, 0.5) < 2 < steep.gain(32, 0.95)
    flat = CostModel(0.004, {1: 0.030, 8: 0.032, 16: 0.036, 32: 0.045})
    assert flat.gain(32, 0.9) > 3.5


def test_a_draft_prefill_pays_only_if_it_leaves_time_to_speculate():
    """A draft of 11 ms a token beside a target of 77 ms a token, 48 new tokens (3.7 s
    alone): a 300-token prompt (3.3 s) is worth it where speculation would multiply
    the pace by 5, not at a modest gain, unless the request is long (512 tokens)."""
    costs = CostModel(0.011, {1: 0.077, 2: 0.087, 8: 0.161, 16: 0.223, 32: 0.402})
    modest, high = costs.gain(32, 0.4), costs.gain(32, 0.99)   # about 1.2 and 5
    assert costs.prefill_pays(20, 48, modest) and costs.prefill_pays(300, 512, modest)
    assert not costs.prefill_pays(300, 48, modest) and costs.prefill_pays(300, 48, high)
    assert not costs.prefill_pays(600, 48, high)    # longer than the whole request
    assert not costs.prefill_pays(100, 512, costs.gain(32, 0.0))   # speculation is not expected to pay at all
    assert not costs.prefill_pays(3, 512, costs.gain(32, 0.0))     # nor where the draft holds the prompt already
    costs.observe_prefill(600, 0.6)            # a draft that prefills in batches: 1 ms a token
    assert 0.008 < costs.prefill_s < 0.010     # one timing moves the estimate a fifth of the way
    for _ in range(20):
        costs.observe_prefill(600, 0.6)
    assert costs.prefill_pays(600, 48, modest)


def test_a_draft_that_cannot_beat_the_target_on_every_core_is_not_prefilled():
    """Qwen2.5-Coder-1.5B on one core (153 ms a token, windows of 4 and 8 cost 285 and 572
    ms) and its 0.5B draft (58 ms a token): at 80% acceptance a pipelined round beats the
    one-core token, but not the target alone on both cores (0.58 of it). Judged against
    the one-core token, the request would prefill its draft and probe; against the target
    alone's own pace it goes on target-only at once."""
    verify = {1: 0.153, 4: 0.285, 8: 0.572}
    own_core, both_cores = CostModel(0.058, verify), CostModel(0.058, verify, alone_pace=0.58)
    assert own_core.gain(32, 0.8) > 1.2 and own_core.prefill_pays(64, 96, own_core.gain(32, 0.8))
    assert both_cores.alone_s() == pytest.approx(0.58 * 0.153)
    assert both_cores.gain(32, 0.8) < 1 and not both_cores.prefill_pays(64, 96, both_cores.gain(32, 0.8))
    assert both_cores.gain(32, 0.99) > 1          # a draft that nearly always agrees would still pay


def test_a_rejection_costs_the_pipeline_a_restart():
    """After a rejection the draft has no window ready: the target waits while it drafts a
    short one (Windows.restart). Qwen2.5-Coder-1.5B and its 0.5B draft as calibrated on the
    2-core EPYC (62 ms a draft token; verify passes of 1, 2, 4 and 6 tokens 145, 178, 224
    and 409 ms; the target alone 86 ms a token on both cores): a round that keeps its
    window of 4 lasts the draft's 248 ms and commits 3.3 tokens at 87% acceptance, 76 ms
    a token, but the restarts bring the pace to 88 ms: speculating is not expected to pay."""
    verify = {1: 0.145, 2: 0.178, 4: 0.224, 6: 0.409, 8: 0.504}
    costs = CostModel(0.062, verify, alone_pace=0.086 / 0.145)
    unbroken = max(4 * 0.062, verify[4]) / sum(0.87 ** j for j in range(4))
    assert costs._pipelined_s(4, 0.87) > 1.1 * unbroken
    assert costs.gain(32, 0.87) < 1 and not costs.prefill_pays(64, 96, costs.gain(32, 0.87))
    assert costs._pipelined_s(4, 1.0) == pytest.approx(unbroken * sum(0.87 ** j for j in range(4)) / 4)
    assert costs.gain(32, 0.99) > 1.3          # where the draft nearly always agrees it would pay


def test_a_short_prompt_starts_no_probe_that_cannot_pay():
    """A prompt under LONG_PROMPT tokens has its draft prefilled beside the target's
    prompt: only where speculating may beat the target alone (Decoder.drafting_pays), the
    decision plan_draft_prefill makes for longer prompts. The costs: Qwen2.5-Coder as in
    test_a_rejection_costs_the_pipeline_a_restart, and a draft four times cheaper."""
    verify = {1: 0.145, 2: 0.178, 4: 0.224, 6: 0.409, 8: 0.504}
    caps = Capabilities(32, 4, False, True, False, False, False)
    request = Request(0, SamplingParams(mode="duodec", seed=1), Sampling(Rule.GREEDY), 4, 1, rebalance=True)

    def may_pay(draft_s: float, speculation=Speculation.AUTO) -> bool:
        costs = CostModel(draft_s, verify, alone_pace=0.086 / 0.145)
        asked = dataclasses.replace(request, speculation=speculation)
        return Decoder(asked, caps, None, None, Output([1, 2, 3], 8, set(), None, None), costs).drafting_pays()

    assert not may_pay(0.062)
    assert may_pay(0.062, Speculation.ALWAYS)
    assert may_pay(0.015)


def test_a_restart_is_never_longer_than_the_pipelined_window():
    """Where drafting never catches up with a steep verify curve, the start-up gamma is
    max_gamma (32); restarts follow the cost model's window, not it (Windows.restart)."""
    verify = {1: 0.120, 2: 0.143, 4: 0.203, 6: 0.337, 8: 0.494, 16: 0.830, 24: 1.198}
    costs = CostModel(0.0446, verify)
    assert choose_gamma(0.0446, verify, 32) == 32
    windows = Windows(32, rebalance=True, max_gamma=32, costs=costs)
    assert windows.restart(0.8, 0.3, room=100) == costs.best_pipelined(32, 0.8) - 1 < 8
    fixed = Windows(32, rebalance=False, max_gamma=32, costs=costs)
    assert fixed.restart(0.8, 0.3, room=100) == 8   # only the pace limits it
