"""The acceptance rule alone, on synthetic distributions (as vLLM tests its rejection sampler)."""
import numpy as np
import pytest

from hetspec.core.acceptance import accept_greedy, accept_sampled, sample
from hetspec.core.sampling import draw_keyed


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


def test_a_guess_proposed_with_certainty_keeps_the_target_distribution():
    """q None (a lookup guess, lookup.py): two guessed tokens, then the bonus; the
    committed pair is distributed as the target's own, whatever was guessed."""
    rng = np.random.default_rng(3)
    vocab, n = 4, 60_000
    p1 = _random_dist(rng, vocab)
    p2 = np.stack([_random_dist(rng, vocab) for _ in range(vocab)])
    guess = np.array([int(np.argsort(p1)[-2]), 2])   # the target's second choice, then any token
    counts = np.zeros((vocab, vocab))
    for _ in range(n):
        n_acc, token = accept_sampled(guess, None, np.stack([p1, p2[guess[0]], p2[guess[1]]]), rng)
        first = guess[0] if n_acc >= 1 else token
        second = guess[1] if n_acc == 2 else (token if n_acc == 1 else sample(p2[first], rng))
        counts[first, second] += 1
    assert 0.5 * np.abs(counts / n - p1[:, None] * p2).sum() < 0.02


def test_a_drafted_token_then_a_certain_guess_keeps_the_target_distribution():
    """q with fewer rows than the window (a drafted token, then a lookup guess after it,
    Window.then): the committed pair is distributed as the target's own."""
    rng = np.random.default_rng(4)
    vocab, n = 4, 60_000
    p1 = _random_dist(rng, vocab)
    p2 = np.stack([_random_dist(rng, vocab) for _ in range(vocab)])
    q1 = _random_dist(rng, vocab)
    counts = np.zeros((vocab, vocab))
    for _ in range(n):
        d1 = sample(q1, rng)
        guess = (d1 + 1) % vocab                   # the guess after it: a function of the tokens before
        n_acc, token = accept_sampled(np.array([d1, guess]), q1[None], np.stack([p1, p2[d1], p2[guess]]), rng)
        first = d1 if n_acc >= 1 else token
        second = guess if n_acc == 2 else (token if n_acc == 1 else sample(p2[first], rng))
        counts[first, second] += 1
    assert 0.5 * np.abs(counts / n - p1[:, None] * p2).sum() < 0.02


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


def test_sample_by_blocks_draws_what_the_whole_cdf_would():
    """sample() finds a block by mass, then the token within it; for the same random
    numbers it must pick what inverse-CDF sampling over the whole vocabulary picks.
    The last blocks hold no mass: a number at the very end (1.0, which random()
    never returns, but a product may round up to the total) must fall back to the
    last token that has some."""
    probs = np.zeros(5000, dtype=np.float32)
    probs[[3, 17, 900, 1023, 1024, 3000]] = [0.1, 0.2, 0.1, 0.15, 0.25, 0.2]
    cdf = np.cumsum(probs, dtype=np.float64)
    ours, reference = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(2000):
        expected = int(np.searchsorted(cdf, reference.random() * cdf[-1], side="right"))
        assert sample(probs, ours) == expected

    class End:
        def random(self):
            return 1.0
    assert sample(probs, End()) == 3000


def _spread(rng, vocab, tokens):
    """A distribution over a few tokens scattered across the vocabulary's blocks."""
    probs = np.zeros(vocab, dtype=np.float32)
    probs[tokens] = _random_dist(rng, len(tokens))
    return probs


def test_keyed_draws_follow_the_distribution_independently_at_each_position():
    """Over seeds, the keyed draws at two positions (the second's distribution chosen
    by the first draw) have the joint law of two ordinary samples; the vocabulary
    spans several of the race's blocks, most of it of zero probability."""
    rng = np.random.default_rng(3)
    vocab, tokens, n = 2500, [3, 1030, 1031, 2049, 2499], 40_000
    p1 = _spread(rng, vocab, tokens)
    p2 = [_spread(rng, vocab, tokens) for _ in tokens]
    counts = np.zeros((len(tokens), len(tokens)))
    for seed in range(n):
        first = tokens.index(draw_keyed(p1, seed, 7))
        counts[first, tokens.index(draw_keyed(p2[first], seed, 8))] += 1
    exact = p1[tokens][:, None] * np.stack([p[tokens] for p in p2])
    assert 0.5 * np.abs(counts / n - exact).sum() < 0.02
    assert draw_keyed(p1, 5, 7) == draw_keyed(p1.copy(), 5, 7)        # a function of its arguments alone


def test_keyed_draws_of_close_distributions_mostly_agree():
    """What makes a keyed draft useful: with the same key, a draft's draw is the
    target's far more often than an independent sample from the draft would be."""
    rng = np.random.default_rng(4)
    p = np.zeros(3000)
    p[rng.choice(3000, 40, replace=False)] = rng.dirichlet(np.ones(40))
    q = p * np.exp(0.3 * rng.normal(size=3000))
    q /= q.sum()
    tv = 0.5 * np.abs(p - q).sum()
    agree = np.mean([draw_keyed(p, seed, 0) == draw_keyed(q, seed, 0) for seed in range(4000)])
    assert agree > (1 - tv) / (1 + tv) - 0.03 and agree > 3 * float(p @ q)
