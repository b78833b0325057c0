"""Drafting for several requests at once (scheduler/batch.py, DraftBatch): each request
in a cache of its own, and each draft token one pass of the native model for all of
them (hs_forward_batch), as the target verifies a batch.

A request's cache is the one it drafts in alone (Drafter.use), kept in step with its
context by longest common prefix (drafter.py); the reply says how much of each context
a cache holds (DraftedBatch.cached). A cache far behind (a request just admitted, or
back from a rest) catches up a chunk at a time, beside the target's passes, before it
drafts.
"""
from __future__ import annotations

import time

import numpy as np

from hetspec.core.sampling import GREEDY, Rule, Sampling, draw_keyed
from hetspec.workers.draft.drafter import Drafter


class BatchDrafter:
    def __init__(self, drafter: Drafter, vocab: int = 0):
        """Over the lone drafter's caches and its record of them; the model is a NativeModel."""
        self.drafter = drafter
        self.model = model = drafter.model
        self.vocab = vocab if 0 < vocab < model.n_vocab else model.n_vocab   # [draft] vocab: the rest never drafted

    def draft(self, windows: list[tuple[int, np.ndarray, Sampling]], gamma: int, catch_up: int
              ) -> tuple[np.ndarray, list[int], list[int]]:
        """(tokens (len(windows), gamma), each window's drafted length, each cache's tokens
        of its context) for windows of (cache, context, sampling). A cache first reads its
        context after the prefix it holds, at most catch_up tokens; one that then holds it
        all (but the last token, whose logits the first draft token comes from) drafts."""
        feeds = [self._feed(cache, context, catch_up) for cache, context, _ in windows]
        ready = [i for i, ((_, feed, keep), (_, context, _)) in enumerate(zip(feeds, windows))
                 if gamma > 0 and keep + len(feed) == len(context)]
        rows = self._run(feeds)[ready]
        tokens = np.zeros((len(windows), gamma), np.int32)
        for j in range(gamma if ready else 0):     # a token for every ready window a pass
            for row, i in enumerate(ready):
                _, context, sampling = windows[i]
                tokens[i, j] = self._choose(rows[row], sampling, len(context) + j)
            if j + 1 < gamma:
                rows = self._run([(windows[i][0], tokens[i, j:j + 1], len(windows[i][1]) + j) for i in ready])
        self.model.rest()         # (each ready cache holds its context and the window but its last token)
        return tokens, [gamma * (i in ready) for i in range(len(windows))], [k + len(f) for _, f, k in feeds]

    def _feed(self, cache: int, context: np.ndarray, catch_up: int) -> tuple[int, np.ndarray, int]:
        """(cache, the tokens it reads next, at which position): what follows the longest
        prefix of context it holds (the last token at least), at most catch_up tokens."""
        held = self.drafter.held(cache)
        n = min(len(held), len(context) - 1)
        mismatch = np.flatnonzero(held[:n] != context[:n])
        keep = int(mismatch[0]) if len(mismatch) else n
        return cache, context[keep:keep + catch_up], keep

    def _run(self, feeds: list[tuple[int, np.ndarray, int]]) -> np.ndarray:
        """Each feed's tokens (cache, tokens, at position) into its cache, in passes of up
        to max_window tokens; the logits after each feed's last token, a row each."""
        feeds = [(c, np.asarray(t, np.int32), p) for c, t, p in feeds]
        lengths = self.drafter.lengths
        for cache, tokens, pos in feeds:     # a failed pass leaves each cache holding no more than before
            lengths[cache] = min(lengths[cache], pos)
        fed = [(c, t, p) for c, t, p in feeds if len(t)]
        logits = np.full((len(feeds), self.model.n_vocab), -np.inf, np.float32)
        if not fed:
            return logits
        tokens = np.concatenate([t for _, t, _ in fed])
        positions = np.concatenate([np.arange(p, p + len(t)) for _, t, p in fed]).astype(np.int32)
        kcaches, vcaches = (np.concatenate([np.full(len(t), self.model.cache(c)[i].ctypes.data, np.uint64)
                                            for c, t, _ in fed]) for i in (0, 1))
        lasts = np.zeros(len(tokens), bool)
        lasts[np.cumsum([len(t) for _, t, _ in fed]) - 1] = True
        rows = self.model.window_logits(self.model.forward_rows(tokens, positions, kcaches, vcaches, lasts))
        rows[:, self.vocab:] = -np.inf
        for (cache, t, p) in fed:
            self.drafter.tokens[cache, p:p + len(t)] = t
            lengths[cache] = p + len(t)
        logits[[i for i, (_, t, _) in enumerate(feeds) if len(t)]] = rows
        return logits

    def _choose(self, logits: np.ndarray, sampling: Sampling, position: int) -> int:
        """The draft's token at `position`: its argmax, or the keyed draw there (the target's rule)."""
        d = Drafter._distribution_fn(sampling)(logits)
        if sampling.rule is Rule.GREEDY:
            return int(np.argmax(d))
        return draw_keyed(d, sampling.seed, position)

    def time_steps(self, sizes: list[int], repeats: int = 3) -> dict[str, float]:
        """The fastest of `repeats` batched draft steps of each size (a token each in as many
        caches, after a context of max_window positions), to price a batch's window."""
        timed = {}
        for n in sizes:
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                rows = self._run([(c, np.zeros(1, np.int32), self.model.max_window) for c in range(n)])
                for row in rows:
                    self._choose(row, GREEDY, 0)
                best = min(best, time.perf_counter() - start)
            timed[str(n)] = best
        self.drafter.lengths[:] = [0] * len(self.drafter.lengths)
        self.model.rest()
        return timed
