"""The acceptance rule: which draft tokens the target keeps, and what comes next.

Pure functions over numpy arrays, so the rule that makes hetspec lossless can
be tested on its own. Both return (n_accepted, next_token): the first
n_accepted draft tokens are kept, then next_token is committed. next_token is
the target's correction at the first rejected position, or, when every draft
token was accepted, the target's own next token (the bonus).

Which rule a request uses:
  greedy     accept_greedy over the target's argmax;
  keyed      accept_greedy over the target's keyed draws (core/sampling.draw_keyed):
             each committed token is the target's own draw at its position, so
             the output is what the target alone samples with that seed;
  unkeyed    accept_sampled, for unseeded sampling with a draft of the target's
             vocabulary: it keeps more of a moderately good draft's tokens.
"""
from __future__ import annotations

import numpy as np

from hetspec.core.sampling import sample


def accept_greedy(draft: np.ndarray, target_choice: np.ndarray) -> tuple[int, int]:
    """target_choice[i] is the target's token at draft position i (argmax, or keyed
    draw); it has one more entry than draft (the position after the window)."""
    n = len(draft)
    mismatch = np.flatnonzero(draft != target_choice[:n])
    a = int(mismatch[0]) if len(mismatch) else n
    return a, int(target_choice[a])


def accept_sampled(draft: np.ndarray, q: np.ndarray | None, p: np.ndarray,
                   rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    draft[i] was drawn from q[i]; p[i] is the target's distribution there, and
    p has one more row (after the window). Accept draft[i] with probability
    min(1, p/q); on rejection sample from normalize(max(0, p - q)). The committed
    tokens are then distributed exactly as the target's own samples. Past q's rows
    (all, q None) each draft token was proposed with certainty (a lookup guess, a
    function of the tokens before it), so q[i] is one-hot.
    """
    certain = 0 if q is None else len(q)
    for i, x in enumerate(draft):
        px, qx = p[i, x], (1.0 if i >= certain else q[i, x])
        if qx <= 0.0 or rng.random() * qx >= px:     # reject with probability 1 - min(1, p/q)
            if i >= certain:
                residual = p[i].copy()
                residual[x] = 0.0
            else:
                residual = np.maximum(p[i] - q[i], 0.0)
            total = residual.sum()
            return i, sample(residual / total if total > 0 else p[i], rng)
    return len(draft), sample(p[len(draft)], rng)
