"""Logits to the sampling distribution (temperature, then top-k, then top-p), and a draw from it.

The target's distribution defined here is the one hetspec's output follows
exactly; the draft uses the same function for its own proposal distribution.
"""
from __future__ import annotations

import numpy as np

# The top-p nucleus usually sits in a few tokens: look among those above a floor first
# rather than sorting the whole vocabulary, which would cost more than the rest of a row.
_NUCLEUS_FLOORS = (1e-4, 1e-6)


def probabilities(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Rows of logits (n, vocab) -> rows of probabilities, float32. temperature > 0."""
    x = np.asarray(logits, dtype=np.float32) / np.float32(temperature)
    if top_k and top_k < x.shape[-1]:
        kth = np.partition(x, -top_k, axis=-1)[:, -top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    probs = np.exp(x)
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        for row in probs:
            _keep_nucleus(row, top_p)
    return probs


def _keep_nucleus(row: np.ndarray, top_p: float) -> None:
    """Zero all but the smallest set of most likely tokens whose mass reaches top_p
    (equal probabilities: the lower token id first).

    If the tokens above a floor hold top_p between them, they are the most likely
    ones, so the nucleus is among them: only they need sorting."""
    for floor in _NUCLEUS_FLOORS:
        top = np.flatnonzero(row > floor)
        if row[top].sum(dtype=np.float64) >= top_p:
            break
    else:                                # rare: a flat distribution
        top = np.arange(len(row))
    order = top[np.argsort(-row[top], kind="stable")]
    cumulative = np.cumsum(row[order], dtype=np.float64)
    n_keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
    mask = np.zeros(len(row), dtype=bool)
    mask[order[:n_keep]] = True
    row[~mask] = 0.0
    row /= row.sum()


def softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    return sample_at(probs, rng.random())


def sample_at(probs: np.ndarray, u: float) -> int:
    """The token at u in [0, 1) of the inverse CDF, over the tokens of nonzero
    probability: after top-p they are a few of the vocabulary, and a float64 cumsum
    over all of it is slow. The token for a given u is the same as over the whole
    vocabulary (zeros add nothing to the CDF). float64, so rounding cannot skip the tail."""
    support = np.flatnonzero(probs)
    cdf = np.cumsum(probs[support], dtype=np.float64)
    return int(support[min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1)])


def uniform_at(seed: int, position: int) -> float:
    """The random number of a sequence's position under a seed: a request that
    draws each token with its position's number gives the same tokens however its
    rounds fell (core/acceptance.accept_drawn)."""
    return float(np.random.default_rng([seed, 1, position]).random())
