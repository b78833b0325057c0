"""Free guesses for the target's solo steps: prompt lookup (Saxena 2023; llama.cpp's `lookup` example). The context's
last n tokens (n = NGRAM down to 1) are looked up earlier in it, and the tokens that followed there are the guess.

Verifying [last token] + k guessed tokens costs a target little more than the last token alone (a CPU target reads
its weights once for the window) and commits every guessed token it agrees with, so text that repeats itself (code,
a document quoted back, a base model's loops) goes several tokens a pass. The guess depends on the committed context
alone, so the acceptance rules keep the output the target's own (core/acceptance.py: a draft proposed with
certainty). It follows the n-gram's most frequent follower, the latest on a tie (after `self.`, the name used most,
not last), and each n keeps its own hit rate: a one-token match holds far less often than a three-token one.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

NGRAM = 3          # the longest suffix looked up; a longer match is the better guess
HIT_PRIOR = 0.5         # where the hit rate of each match length starts...
HIT_PRIOR_WEIGHT = 5    # ...worth this many guessed tokens

NOTHING = np.zeros(0, dtype=np.int32)


class PromptLookup:
    """One request's index: each n-gram's followers, with how often and where each last came; grown as tokens commit."""

    def __init__(self):
        # [n - 1]: n-gram -> {follower: (times seen, position of its latest occurrence)}
        self.after: list[dict[tuple, dict[int, tuple[int, int]]]] = [{} for _ in range(NGRAM)]
        self.indexed = 0          # positions 1..indexed - 1 are recorded as followers
        self.hits: dict[int, list[int]] = {}   # n -> [guessed tokens the target kept, guesses it cut short]
        self.matched = 0          # n of the last guess

    def guess(self, context: np.ndarray, length: Callable[[float], int], ahead: np.ndarray = NOTHING) -> np.ndarray:
        """The likeliest continuation of the longest suffix seen earlier, length(that match length's hit rate) long.
        ahead: drafted tokens after the context, not yet verified: the guess continues them (they are not indexed)."""
        self.matched, start = self.match(context, ahead)
        if not self.matched:
            return NOTHING
        return context[start:start + length(self.hit_rate(self.matched))].copy()

    def verified(self, guessed: int, accepted: int) -> None:
        """The target kept `accepted` tokens of the last guess, `guessed` long."""
        hits = self.hits.setdefault(self.matched, [0, 0])
        hits[0] += accepted
        hits[1] += accepted < guessed

    def hit_rate(self, matched: int) -> float:
        """Per-token acceptance so far of guesses that matched `matched` tokens."""
        kept, cut = self.hits.get(matched, (0, 0))
        return (kept + HIT_PRIOR_WEIGHT * HIT_PRIOR) / (kept + cut + HIT_PRIOR_WEIGHT)

    def match(self, context: np.ndarray, ahead: np.ndarray = NOTHING) -> tuple[int, int]:
        """(n, start): the longest suffix of context and ahead seen earlier in the context, n tokens (0: none), and its
        likeliest follower's latest position."""
        self._index(context)
        tail = (context[-NGRAM:].tolist() + ahead.tolist())[-NGRAM:]
        for n in range(min(NGRAM, len(tail)), 0, -1):
            followers = self.after[n - 1].get(tuple(tail[-n:]))
            if followers:
                return n, max(followers.values())[1]
        return 0, 0

    def _index(self, context: np.ndarray) -> None:
        """Record the n-grams that end just before each position not yet seen."""
        first = max(self.indexed, 1)
        base = max(first - NGRAM, 0)
        ids = context[base:].tolist()
        for i in range(first, len(context)):
            follower = ids[i - base]
            for n in range(1, min(NGRAM, i) + 1):
                followers = self.after[n - 1].setdefault(tuple(ids[i - n - base:i - base]), {})
                followers[follower] = (followers.get(follower, (0, 0))[0] + 1, i)
        self.indexed = len(context)
