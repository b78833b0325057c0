"""The acceptance rule alone, on synthetic distributions (as vLLM tests its rejection sampler)."""
import numpy as np
import pytest

from hetspec.core.acceptance import accept_drawn, accept_greedy, accept_sampled, sample
from hetspec.core.sampling import sample_at


def test_greedy_all_accepted_gives_bonus():
    assert accept_greedy(np.array([3, 1, 4]), np.array([3, 1, 4, 7])) == (3, 7)


def test_greedy_early_mismatch_gives_correction():
    assert accept_greedy(np.array([3, 1, 4]), np.array([3, 9, 4, 7])) == (1, 9)
    assert accept_greedy(np.array([3, 1, 4]), np.array([5, 1, 4, 7])) == (0, 5)


def test_greedy_empty_window_is_plain_decoding():
    assert accept_greedy(np.array([], dtype=np.int64), np.array([6])) == (0, 6)


def _random_dist(rng, vocab, peaked=1.0):
    x = rng.random(vocab) ** (1 + 4 * peaked)
    return (x / x.sum()).astype(np.float32)


@pytest.mark.parametrize("case", ["random", "disjoint", "point_mass_draft"])
def test_sampled_first_token_follows_target(case):
    """Whatever the draft proposes, the first committed token is distributed as p."""
    rng = np.random.default_rng(0)
    vocab, n = 10, 40_000
    p = _random_dist(rng, vocab)
    if case == "random":
        q = _random_dist(rng, vocab)
    elif case == "disjoint":
        q = np.zeros(vocab, np.float32)
        q[np.argsort(p)[:3]] = 1 / 3            # the draft likes what the target does not
    else:
        q = np.zeros(vocab, np.float32)
        q[rng.integers(vocab)] = 1.0            # a greedy draft
    bonus = _random_dist(rng, vocab)
    counts = np.zeros(vocab)
    for _ in range(n):
        x = sample(q, rng)
        n_acc, token = accept_sampled(np.array([x]), q[None], np.stack([p, bonus]), rng)
        counts[x if n_acc == 1 else token] += 1
    empirical = counts / n
    # total variation to p is small, and much smaller than to q (a broken sampler drifts to q)
    assert 0.5 * np.abs(empirical - p).sum() < 0.015
    assert 0.5 * np.abs(empirical - q).sum() > 0.1 or case == "random"


def test_sampled_two_positions_joint_distribution():
    """Acceptance chains: the second token is p2 given the first, jointly exact."""
    rng = np.random.default_rng(1)
    vocab, n = 4, 60_000
    p1 = _random_dist(rng, vocab)
    p2 = np.stack([_random_dist(rng, vocab) for _ in range(vocab)])    # p(second | first)
    q1 = _random_dist(rng, vocab)
    q2 = _random_dist(rng, vocab)
    counts = np.zeros((vocab, vocab))
    for _ in range(n):
        d1 = sample(q1, rng)
        d2 = sample(q2, rng)
        p_rows = np.stack([p1, p2[d1], p2[d2]])   # the third row is never used for position 2
        n_acc, token = accept_sampled(np.array([d1, d2]), np.stack([q1, q2]), p_rows, rng)
        if n_acc == 0:
            first = token
            second = sample(p2[first], rng)       # what the next round would do
        elif n_acc == 1:
            first, second = d1, token
        else:
            first, second = d1, d2
        counts[first, second] += 1
    exact = p1[:, None] * p2
    assert 0.5 * np.abs(counts / n - exact).sum() < 0.02


def test_sample_respects_zero_probabilities():
    rng = np.random.default_rng(2)
    probs = np.array([0.0, 0.5, 0.0, 0.5], dtype=np.float32)
    draws = {sample(probs, rng) for _ in range(2000)}
    assert draws == {1, 3}


def test_sample_over_the_support_draws_what_the_whole_cdf_would():
    """sample() searches only the nonzero tokens; for the same random numbers it
    must pick what inverse-CDF sampling over the whole vocabulary picks."""
    probs = np.zeros(5000, dtype=np.float32)
    probs[[3, 17, 900, 4999]] = [0.1, 0.4, 0.3, 0.2]
    cdf = np.cumsum(probs, dtype=np.float64)
    ours, reference = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(500):
        expected = int(min(np.searchsorted(cdf, reference.random() * cdf[-1], side="right"), len(cdf) - 1))
        assert sample(probs, ours) == expected


def test_drawn_rule_keeps_the_target_distribution_and_the_target_only_tokens():
    """A proposal from another vocabulary has no probability here: the target draws
    its own token with each position's random number and keeps x only if it is
    that draw. The committed tokens follow p over two positions, x is kept with
    probability p(x), and whatever x is the tokens are those the target alone
    draws with the same numbers."""
    rng = np.random.default_rng(3)
    vocab, n = 5, 60_000
    p1 = _random_dist(rng, vocab)
    p2 = np.stack([_random_dist(rng, vocab) for _ in range(vocab)])
    counts, kept = np.zeros((vocab, vocab)), np.zeros(vocab)
    for i in range(n):
        x1, x2 = i % vocab, (3 * i + 1) % vocab            # proposals of any kind, even unlikely ones
        u = rng.random(3)
        n_acc, token = accept_drawn(np.array([x1, x2]), np.stack([p1, p2[x1], p2[x1]]), u)
        first = x1 if n_acc >= 1 else token
        second = (x2 if n_acc == 2 else token) if n_acc >= 1 else sample_at(p2[first], u[1])
        alone = sample_at(p1, u[0])
        assert (first, second) == (alone, sample_at(p2[alone], u[1]))
        counts[first, second] += 1
        kept[x1] += n_acc >= 1
    assert 0.5 * np.abs(counts / n - p1[:, None] * p2).sum() < 0.02
    assert np.abs(kept / (n / vocab) - p1).max() < 0.02
