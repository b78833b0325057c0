"""Draft branches (how many, how long, which one the target's token picks) and the
distributions they are drawn from: small pure functions."""
import numpy as np

from hetspec.core.branches import (
    allocate_budget,
    count_sequences,
    first_tokens,
    from_slot,
    pick_branch,
    split_budget,
    to_slot,
)
from hetspec.core.sampling import probabilities


def test_dynamic_sequences_follow_threshold():
    first = np.array([0.5, 0.3, 0.15, 0.05])
    # theta = 0.5 * 0.9 = 0.45: nobody else qualifies
    assert count_sequences(first, 0.9, 4) == 1
    # theta = 0.5 * 0.4 = 0.2: candidate 2 (0.3) qualifies, 0.15 does not
    assert count_sequences(first, 0.4, 4) == 2
    # theta = 0.05: 0.3 and 0.15 qualify; the cap limits it
    assert count_sequences(first, 0.1, 4) == 3
    assert count_sequences(first, 0.1, 2) == 2


def test_budget_split_keeps_total():
    assert split_budget(10, 1) == [10]
    assert split_budget(10, 3) == [4, 3, 3]
    assert sum(split_budget(11, 4)) == 11
    assert split_budget(3, 4) == [3]          # branches need two tokens each


def test_dynamic_budget_goes_where_tokens_are_likely_accepted():
    # A sure draft: the alternative is never worth a pass, whatever its first-token probability.
    assert allocate_budget(8, [0.6, 0.4], 0.99) == [8]
    # An unsure draft: 0.5 * 0.6**n falls below 0.4 after one pass, then they alternate
    # over the 6 passes left once the rewind's is paid; worth 1.06 tokens against 0.73 alone.
    assert allocate_budget(8, [0.5, 0.4], 0.6) == [4, 4]
    # Passes (tokens minus branches) add up to n_tokens - 2: one goes to the rewind.
    lengths = allocate_budget(10, [0.4, 0.3, 0.2], 0.7)
    assert len(lengths) > 1 and sum(n - 1 for n in lengths) == 8 and lengths == sorted(lengths, reverse=True)
    # A branch that gets no pass is dropped: it would be a bare guess.
    assert allocate_budget(5, [0.7, 0.2, 0.1], 0.8) == [5]
    assert allocate_budget(3, [0.45, 0.45], 0.5) == [3]      # too short to pay for a rewind
    assert allocate_budget(1, [0.7, 0.3], 0.8) == [1]


def test_alternatives_must_pay_for_the_rewind():
    # a = 0.9, nearly even candidates: alone, the 5 passes are worth 0.45 * 4.10 = 1.84 tokens;
    # two branches of 3 share 4 passes, worth 0.89 * 1.9 = 1.69: one branch.
    assert allocate_budget(6, [0.45, 0.44], 0.9) == [6]
    # a = 0.7: alone 0.45 * 2.77 = 1.25, two branches 0.89 * 1.7 = 1.51: two.
    assert allocate_budget(6, [0.45, 0.44], 0.7) == [3, 3]


def test_first_tokens_most_likely_first():
    assert first_tokens(np.array([0.1, 0.6, 0.05, 0.25]), 3) == [1, 3, 0]
    # Logits, negative ones included.
    assert first_tokens(np.array([-3.0, 2.0, -1.0, 0.0, 2.5]), 2) == [4, 1]


def test_first_tokens_of_a_top_p_distribution():
    """Mostly zeros, as top-p leaves a distribution: fewer nonzero tokens than
    asked for are padded with zero-probability ones, lowest id first."""
    probs = np.zeros(49152, dtype=np.float32)
    probs[[40000, 12, 777]] = [0.2, 0.5, 0.3]
    assert first_tokens(probs, 2) == [12, 777]
    assert first_tokens(probs, 5) == [12, 777, 40000, 0, 1]
    assert count_sequences(probs, 0.9, 4) == 1      # theta 0.45: nothing else qualifies
    assert count_sequences(probs, 0.5, 4) == 2      # theta 0.25: 0.3 qualifies, 0.2 does not
    assert count_sequences(probs, 0.3, 4) == 3      # theta 0.15: both do; zeros never do


def test_branch_choice_by_target_token():
    branches = from_slot(np.array([5, 6, 7, 9, 1, 2]), [3, 3])
    assert [b.tolist() for b in branches] == [[5, 6, 7], [9, 1, 2]]
    assert [b.tolist() for b in from_slot(np.array([5, 6, 7, 9, 1, 2, 4]), [3, 3], grown_to=7)] == \
        [[5, 6, 7], [9, 1, 2, 4]]                        # the last (likeliest) branch grew after the reply
    assert to_slot([[1], [2], [3]]) == [[3], [2], [1]]   # the drafter's likeliest-first order, reversed
    assert pick_branch(branches, 9) == 1
    assert pick_branch(branches, 5) == 0
    assert pick_branch(branches, 4) is None


def test_probabilities_top_k_and_top_p():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    full = probabilities(logits, 1.0)
    assert np.allclose(full, [[0.5, 0.3, 0.15, 0.05]], atol=1e-6)
    top2 = probabilities(logits, 1.0, top_k=2)
    assert np.allclose(top2, [[0.625, 0.375, 0, 0]], atol=1e-6)
    nucleus = probabilities(logits, 1.0, top_p=0.8)      # 0.5 + 0.3 reaches 0.8
    assert np.allclose(nucleus, [[0.625, 0.375, 0, 0]], atol=1e-6)
    nucleus = probabilities(logits, 1.0, top_p=0.81)     # needs the third token too
    assert np.count_nonzero(nucleus) == 3
    cold = probabilities(logits, 0.1)
    assert cold[0, 0] > 0.99


def test_nucleus_is_the_most_likely_tokens_whatever_the_shape(rng):
    """The shortcut (sort only the tokens above a floor) keeps exactly what sorting
    the whole vocabulary keeps, for peaked, flat and tiny distributions."""
    def by_full_sort(row, top_p):
        order = np.argsort(-row, kind="stable")
        n_keep = int(np.searchsorted(np.cumsum(row[order], dtype=np.float64), top_p, side="left")) + 1
        return set(order[:n_keep].tolist())

    for scale in (0.01, 0.3, 3.0, 10.0):
        for vocab in (8, 5000, 49152):
            logits = (rng.standard_normal((2, vocab)) * scale).astype(np.float32)
            full = probabilities(logits, 0.7)
            for top_p in (0.5, 0.9, 0.999999):
                kept = probabilities(logits, 0.7, top_p=top_p)
                for row_full, row_kept in zip(full, kept):
                    assert set(np.flatnonzero(row_kept).tolist()) == by_full_sort(row_full, top_p)
                    assert np.isclose(row_kept.sum(), 1.0)
