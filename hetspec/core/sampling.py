"""Logits to the sampling distribution (temperature, then top-k, then top-p), and a draw from it.

The target's distribution defined here is the one hetspec's output follows
exactly; the draft uses the same function for its own proposal distribution.

Two kinds of draw. sample() takes a generator's next number: the speculative
sampling rule (core/acceptance.accept_sampled) needs nothing more. A keyed draw
(draw_keyed) is a function of (seed, position, distribution) alone, so it is the
same whoever makes it and whenever: a seeded request draws each token so, and
a draft that draws so at the same position proposes the target's own draw
whenever their distributions are close (docs/design.md, "Lossless rules").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetspec.core.params import Choice


class Rule(Choice):
    """How the target's tokens are chosen, and so which draft tokens it keeps
    (core/acceptance.py). Decided once per request (scheduler/resolve.py)."""
    GREEDY = "greedy"      # the target's argmax
    KEYED = "keyed"        # the target's keyed draw at each position (draw_keyed): seeded sampling, or any
                           # sampling with a draft of another vocabulary
    UNKEYED = "unkeyed"    # speculative sampling over both distributions (accept_sampled)


@dataclass(frozen=True)
class Sampling:
    """What a worker needs to turn logits into a request's tokens: the distribution
    (temperature, top_k, top_p), the seed of its keyed draws, and the rule."""
    rule: Rule
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


GREEDY = Sampling(Rule.GREEDY)

# The top-p nucleus usually sits in a few tokens: look among those above a floor first
# rather than sorting the whole vocabulary, which would cost more than the rest of a row.
_NUCLEUS_FLOORS = (1e-4, 1e-6)
# Both draws look at a large vocabulary in blocks of this many tokens: first a block by
# its mass, then a token within it.
DRAW_BLOCK = 1024


def probabilities(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Rows of logits (n, vocab) -> rows of probabilities, float32. temperature > 0."""
    x = np.asarray(logits, dtype=np.float32) / np.float32(temperature)
    if top_k and top_k < x.shape[-1]:
        kth = np.partition(x, -top_k, axis=-1)[:, -top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    probs = np.exp(x)
    probs /= probs.sum(axis=-1, keepdims=True)
    return keep_nucleus(probs, top_p)


def keep_nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Each row (n, vocab) cut to its top-p nucleus, in place (top_p 1: as it is)."""
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
    """Inverse CDF, in two steps: find the block of DRAW_BLOCK tokens the random
    number falls in by the blocks' masses, then the token within it. The token for a
    given number is the one a cumsum over the whole vocabulary would give (but at a
    rounding boundary), for a fraction of its cost on a large vocabulary. float64,
    so rounding cannot skip the tail; a number that rounds past the end takes the
    last token of nonzero mass."""
    masses = _block_masses(probs)
    cdf = np.cumsum(masses)
    u = rng.random() * cdf[-1]
    b = int(np.searchsorted(cdf, u, side="right"))
    if b == len(cdf):
        b = int(np.flatnonzero(masses)[-1])
    block = probs[b * DRAW_BLOCK:(b + 1) * DRAW_BLOCK]
    support = np.flatnonzero(block)
    within = np.cumsum(block[support], dtype=np.float64)
    i = min(int(np.searchsorted(within, u - (cdf[b - 1] if b else 0.0), side="right")), len(within) - 1)
    return b * DRAW_BLOCK + int(support[i])


def draw_keyed(probs: np.ndarray, seed: int, position: int) -> int:
    """The keyed draw of the token at `position` of a sequence: exact over seeds,
    independent between positions, and the same for any caller.

    An exponential race: each token x gets an Exp(1) variate E(x) fixed by (seed,
    position, x), and the token of least E(x) / p(x) wins, which is x with
    probability p(x). Two distributions raced with the same E mostly agree on the
    winner (for one race, with probability at least (1 - TV) / (1 + TV): Daliri,
    Musco and Suresh, 2024), so a draft that draws so at the same position proposes
    the target's own draw whenever the two are close. The race runs in two rounds,
    between blocks of DRAW_BLOCK tokens (by their mass), then within the winning
    block: the same law, for a fraction of a whole vocabulary's variates."""
    masses = _block_masses(probs)
    start = DRAW_BLOCK * _race(masses, _key(seed, position, 0), np.arange(len(masses)))
    block = probs[start:start + DRAW_BLOCK]
    return int(_race(block, _key(seed, position, 1), np.arange(start, start + len(block))))


def _block_masses(probs: np.ndarray) -> np.ndarray:
    """The probability of each block of DRAW_BLOCK tokens, float64."""
    return np.add.reduceat(probs, np.arange(0, len(probs), DRAW_BLOCK), dtype=np.float64)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _race(weights: np.ndarray, key: np.ndarray, ids: np.ndarray) -> int:
    """The id of least E(id) / weight among those of nonzero weight."""
    support = np.flatnonzero(weights)
    bits = _mix(key + (ids[support].astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    exponentials = -np.log(((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53)
    return int(ids[support[np.argmin(exponentials / weights[support])]])


def _key(seed: int, position: int, level: int) -> np.ndarray:
    """A counter-based hash's key for one race: its variates are computed for the
    ids asked for only, in any order."""
    key = _mix(np.array([seed], np.uint64) + _GOLDEN)
    return _mix(_mix(key + np.array([position], np.uint64) * _GOLDEN) + np.uint64(level))


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 arrays (their products wrap, as it needs)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
