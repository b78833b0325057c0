"""Dynamic multi-sequence drafting (DuoDecoding section 3.3): how many branches.

When the draft is unsure of the first token of the next window, part of the
budget goes to alternative first tokens. The threshold is
theta = p(1,1) * p(2,1): the probability the draft gives its own top-1 path
over two positions. Every other first-position candidate more likely than
that path starts its own branch.
"""
from __future__ import annotations

import numpy as np


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
    they are worth more than the likeliest branch alone with every pass. (With
    a bfloat16 target, where the draft is less sure, paying that pass unweighed
    left dynamic sequences 1-15% behind one sequence over six benchmark runs;
    weighed, the two were even in two runs.)"""
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

    np.argpartition over 49k entries takes ~8 ms instead of ~0.4 when most of
    them are equal, as the zeros outside a top-p nucleus are: the entries above
    the minimum are partitioned, the minimum's only pad."""
    k = min(k, len(values))
    pool = np.flatnonzero(values > values.min())
    if len(pool) > k:
        pool = pool[np.argpartition(values[pool], -k)[-k:]]
    elif len(pool) < k:
        pool = np.concatenate([pool, np.flatnonzero(values == values.min())[:k - len(pool)]])
    return pool[np.lexsort((pool, -values[pool]))]
