"""Free guesses for the target's solo steps: prompt lookup (Saxena 2023; llama.cpp's
`lookup` example). The context's last n tokens (n = NGRAM down to 1) are looked up
earlier in the context, and the tokens that followed them there are the guess.

A target-only step that verifies [last token] + a guess of k tokens costs little
more than one that verifies the last token alone (a CPU target reads its weights
once for the whole window), and commits every guessed token the target agrees
with. Text that repeats itself (code, a document quoted back, a base model's
loops) then goes several tokens a pass. The guess is a function of the committed
context alone, so the acceptance rules keep the output the target's own
(core/acceptance.py: a guess is a draft proposed with certainty).
"""
from __future__ import annotations

import numpy as np

NGRAM = 3          # the longest suffix looked up; a longer match is the better guess

NOTHING = np.zeros(0, dtype=np.int32)


class PromptLookup:
    """One request's index: for each n-gram of its context, the position just after
    its latest occurrence that something followed. Grown as tokens are committed."""

    def __init__(self):
        self.after: list[dict[tuple, int]] = [{} for _ in range(NGRAM)]   # [n - 1]: n-gram -> position after it
        self.indexed = 0          # positions 1..indexed - 1 are recorded as followers

    def guess(self, context: np.ndarray, limit: int) -> np.ndarray:
        """Up to `limit` tokens that followed the longest suffix of `context` found
        earlier in it (its latest occurrence); nothing if none is found."""
        self._index(context)
        if limit <= 0:
            return NOTHING
        tail = context[-NGRAM:].tolist()
        for n in range(min(NGRAM, len(tail)), 0, -1):
            start = self.after[n - 1].get(tuple(tail[-n:]))
            if start is not None:
                return context[start:start + limit].copy()
        return NOTHING

    def _index(self, context: np.ndarray) -> None:
        """Record the n-grams that end just before each position not yet seen."""
        first = max(self.indexed, 1)
        base = max(first - NGRAM, 0)
        ids = context[base:].tolist()
        for i in range(first, len(context)):
            for n in range(1, min(NGRAM, i) + 1):
                self.after[n - 1][tuple(ids[i - n - base:i - base])] = i
        self.indexed = len(context)
