"""Dynamic multi-sequence drafting (DuoDecoding section 3.3): how many branches,
how long each, how they are laid out in the draft's output slot, and which one
the target's token picks.

When the draft is unsure of the first token of the next window, part of the
budget goes to alternative first tokens. The threshold is
theta = p(1,1) * p(2,1): the probability the draft gives its own top-1 path
over two positions. Every other first-position candidate more likely than
that path starts its own branch. The target does not verify the branches: the
token it commits after the pending window (computed in the same pass) selects
the branch that starts with it.

Slot layout: the draft writes its branches into one flat shared-memory row,
alternatives first and the likeliest branch last, so that the likeliest one
can keep growing at the end of the slot while the target still verifies
(to_slot / from_slot are the only places that know this order).
"""
from __future__ import annotations

import itertools
from typing import Literal

import numpy as np

Dynamic = Literal["dynamic"]
DYNAMIC: Dynamic = "dynamic"   # as many branches as the draft's doubt warrants (count_sequences), not a fixed number


def count_sequences(first_probs: np.ndarray, second_top_prob: float, max_sequences: int) -> int:
    """k = 1 + #{j >= 2 : p(1,j) > p(1,1) * p(2,1)}, at most max_sequences."""
    top = first_probs[_largest(first_probs, max_sequences)]
    theta = top[0] * second_top_prob
    return 1 + int(np.count_nonzero(top[1:] > theta))


def split_budget(gamma: int, k: int) -> list[int]:
    """Split gamma draft tokens over k branches so drafting time stays constant;
    the first (most likely) branch takes any remainder. Each branch needs two
    tokens to be worth anything: its first is only a guess the target decides."""
    k = max(1, min(k, gamma // 2))
    base, extra = divmod(gamma, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def allocate_budget(n_tokens: int, first_probs: list[float], acceptance: float) -> list[int]:
    """Branch lengths for candidate first tokens (most likely first) from a budget
    of n_tokens, i.e. n_tokens - 1 draft forward passes (a branch of L tokens
    costs L - 1: its first token is the candidate itself).

    Each pass goes where it adds the most expected accepted tokens: the j-th
    drafted token of branch i counts only if the target picks its first token
    (p_i) and accepts the j - 1 before it (acceptance per token a), so it is
    worth p_i * a**j. An even split would halve the likely branch whenever an
    alternative qualifies; this gives alternatives only what they are worth.

    Alternatives also cost a pass of their own: the likeliest branch's first
    pass (made to measure theta) is made again once they have rewound the
    cache. So several branches share one pass less, and are drafted only when
    they are worth more than the likeliest branch alone with every pass
    (e7e822d:docs/performance.md, "Dynamic sequences")."""
    a = min(max(acceptance, 0.05), 0.99)
    alone = [max(n_tokens, 1)]
    if len(first_probs) < 2 or n_tokens < 4:     # two passes at least for two branches of two tokens
        return alone
    passes = [0] * len(first_probs)
    for _ in range(n_tokens - 2):
        best = max(range(len(passes)), key=lambda i: (first_probs[i] * a ** passes[i], -i))
        passes[best] += 1
    lengths = [1 + n for n in passes]
    while len(lengths) > 1 and lengths[-1] == 1:
        lengths.pop()
    if len(lengths) == 1 or _worth(lengths, first_probs, a) <= _worth(alone, first_probs, a):
        return alone
    return lengths


def _worth(lengths: list[int], first_probs: list[float], a: float) -> float:
    """Expected accepted tokens of branches of these lengths (see allocate_budget)."""
    return sum(p * sum(a ** j for j in range(n - 1)) for p, n in zip(first_probs, lengths))


def first_tokens(first_probs: np.ndarray, k: int) -> list[int]:
    """The k most likely first tokens, most likely first."""
    return [int(t) for t in _largest(first_probs, k)]


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first (equal ones by index).

    np.argpartition over a whole vocabulary is many times slower when most
    entries are equal, as the zeros outside a top-p nucleus are: so only the
    entries above the minimum are partitioned, the minimum's only pad."""
    k = min(k, len(values))
    pool = np.flatnonzero(values > values.min())
    if len(pool) > k:
        pool = pool[np.argpartition(values[pool], -k)[-k:]]
    elif len(pool) < k:
        pool = np.concatenate([pool, np.flatnonzero(values == values.min())[:k - len(pool)]])
    return pool[np.lexsort((pool, -values[pool]))]


def to_slot(branches: list) -> list:
    """The drafter's branches (likeliest first) in slot order (likeliest last)."""
    return branches[::-1]


def from_slot(tokens: np.ndarray, lengths: list[int], grown_to: int = 0) -> list[np.ndarray]:
    """Cut the flat slot into branches, in slot order. grown_to: the slot's total
    after the likeliest (last) branch kept growing past its reply."""
    lengths = list(lengths)
    if lengths and grown_to > sum(lengths):
        lengths[-1] += grown_to - sum(lengths)
    ends = list(itertools.accumulate(lengths))   # (a handful of ints: plain Python, numpy's cumsum costs more)
    return [tokens[end - n:end] for n, end in zip(lengths, ends)]


def pick_branch(branches: list[np.ndarray], first_token: int) -> int | None:
    """Index of the branch that starts with first_token, or None."""
    for i, branch in enumerate(branches):
        if len(branch) and int(branch[0]) == first_token:
            return i
    return None
