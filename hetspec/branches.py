"""Choosing among the draft's branches: the target's own next token picks one.

With dynamic multi-sequence drafting the draft proposes several branches for
the window after the pending one, each starting with a different first token.
The target does not verify them all: the token it commits after the pending
window (computed in the same pass) selects the branch that starts with it.
"""
from __future__ import annotations

import numpy as np


def split_branches(tokens: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """Cut the flat token array the draft wrote into its branches."""
    bounds = np.cumsum([0, *lengths])
    return [tokens[bounds[i]:bounds[i + 1]] for i in range(len(lengths))]


def pick_branch(branches: list[np.ndarray], first_token: int) -> int | None:
    """Index of the branch that starts with first_token, or None."""
    for i, branch in enumerate(branches):
        if len(branch) and int(branch[0]) == first_token:
            return i
    return None
