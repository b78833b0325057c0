"""The draft algorithm, over any model with forward(tokens, pos) -> last logits.

The drafter keeps each of its KV caches in step with the scheduler by longest
common prefix (as llama.cpp's common/speculative.cpp does): each command carries
the whole context, the drafter keeps what matches and evaluates the rest. So the
scheduler only estimates what a cache holds (DraftLink.held), and tokens the draft
has not yet seen (the target's bonus token, a correction) are fed automatically.
A request drafts in a cache of its own, alone or in a batch (batch_drafter.py),
where the model holds several (the native one's use_cache); else all share one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetspec.core.branches import allocate_budget, count_sequences, first_tokens, split_budget
from hetspec.core.sampling import Rule, Sampling, draw_keyed, probabilities, sample, softmax
from hetspec.ipc.messages import BranchPlan


@dataclass
class DraftOutput:
    branches: list[list[int]]
    probs: list[np.ndarray] = field(default_factory=list)   # per branch: (len, vocab) rows, for accept_sampled


class Drafter:
    def __init__(self, model, n_ctx: int, caches: int = 1):
        self.model = model
        self.tokens = np.zeros((caches, n_ctx), dtype=np.int32)   # each cache's tokens whose KV entries it holds
        self.lengths = [0] * caches                               # ... how many
        self.cache = 0                                            # the cache commands read and write (use)
        self.rng = np.random.default_rng()
        self._likeliest = ([], [], None, None, False)   # (branch, rows, dist, choose, keep_rows) of the last
                                                        # speculative draft

    # ---- cache bookkeeping -------------------------------------------------

    @property
    def cached(self) -> np.ndarray:
        return self.tokens[self.cache]

    @property
    def n_cached(self) -> int:
        return self.lengths[self.cache]

    @n_cached.setter
    def n_cached(self, n: int) -> None:
        self.lengths[self.cache] = n

    def use(self, cache: int) -> None:
        """Read and write a request's cache (its target cache's number) from now on; with one cache, every
        request's is it. Called before each command: a batch's draft may have changed what the cache holds."""
        if len(self.lengths) > 1:
            self.cache = cache
            self.model.use_cache(cache, self.n_cached)

    def held(self, cache: int) -> np.ndarray:
        return self.tokens[cache, :self.lengths[cache]]

    def _feed(self, tokens, pos: int, halt: np.ndarray | None = None) -> np.ndarray | None:
        """The logits after `tokens` at pos..; None where `halt` stopped the model (the
        native one: see NativeModel.forward), the cache then holding what it held before pos."""
        logits = self.model.forward(tokens, pos) if halt is None else self.model.forward(tokens, pos, halt=halt)
        if logits is None:
            self.n_cached = min(self.n_cached, pos)
            return None
        self.cached[pos:pos + len(tokens)] = tokens
        self.n_cached = pos + len(tokens)
        return logits

    def adopt(self, tokens: np.ndarray) -> None:
        """The model's cache was replaced by one holding exactly `tokens`."""
        self.cached[:len(tokens)] = tokens
        self.n_cached = len(tokens)

    def sync(self, context: np.ndarray, reuse: bool = True) -> np.ndarray:
        """Make the cache hold `context`; return the logits after its last token.
        reuse=False evaluates all of it, as a fresh process would."""
        n = min(self.n_cached if reuse else 0, len(context) - 1)   # the last token is always re-run, for its logits
        mismatch = np.flatnonzero(self.cached[:n] != context[:n])
        keep = int(mismatch[0]) if len(mismatch) else n
        return self._feed(context[keep:], keep)

    # ---- drafting ----------------------------------------------------------

    def draft(self, context: np.ndarray, gamma: int, sampling: Sampling, plan: BranchPlan | None = None) -> DraftOutput:
        """gamma tokens after context: one plain sequence, or with a plan the branches
        of a pipelined window (likeliest first), whose first token the target picks.
        Each token is the argmax, the keyed draw at its position (the same draw the
        target makes, core/sampling.draw_keyed) or the generator's next, by the rule;
        only the last needs the distributions returned (accept_sampled)."""
        keep_rows = sampling.rule is Rule.UNKEYED
        dist, choose = self._distribution_fn(sampling), self._choose_fn(sampling)
        first = dist(self.sync(context))
        if plan is None:
            self._likeliest = ([], [], None, None, False)
            branch, rows = self._extend([choose(first)], [first], gamma, dist, choose)
            return DraftOutput([branch], [rows] if keep_rows else [])

        candidates = first_tokens(first, min(plan.max_sequences, len(first)))
        if sampling.rule is Rule.KEYED:        # the target's likeliest draw first
            drawn = choose(first)
            candidates = [drawn] + [c for c in candidates if c != drawn][:len(candidates) - 1]
        lengths, second = self._budgets(first, candidates, gamma, plan, sampling.rule is Rule.GREEDY, dist)
        branches, rows = [None] * len(lengths), [None] * len(lengths)
        # Alternatives first, the most likely branch last: its KV entries then stay
        # in the cache, ready for the next window when the target picks it.
        for i in range(len(lengths) - 1, -1, -1):
            reuse = second if (i == 0 and len(lengths) == 1) else None
            if reuse is None:
                self.n_cached = len(context)   # rewind: the next forward drops the rest
            branches[i], rows[i] = self._extend([candidates[i]], [first], lengths[i], dist, choose, reuse)
        self._likeliest = (branches[0], rows[0], dist, choose, keep_rows)
        return DraftOutput(branches, rows if keep_rows else [])

    def _budgets(self, first, candidates: list[int], gamma: int, plan: BranchPlan, greedy: bool, dist):
        """(each branch's length, the distribution after the likeliest first token or None).
        A fixed number of branches splits gamma evenly; a dynamic one drafts one token past
        the likeliest first to see how sure the draft is (count_sequences), then gives each
        branch a budget by how likely its first token is."""
        if plan.sequences != "dynamic":
            return split_budget(gamma, plan.sequences), None
        if gamma < 4 or plan.max_sequences <= 1:
            return split_budget(gamma, 1), None
        second = dist(self._feed([candidates[0]], self.n_cached))
        as_probs = softmax if greedy else (lambda d: d)
        first_p = as_probs(first)
        k = count_sequences(first_p, float(as_probs(second).max()), plan.max_sequences)
        return allocate_budget(gamma, [float(first_p[c]) for c in candidates[:k]], plan.acceptance), second

    def extend(self, limit: int, halt: np.ndarray | None = None):
        """Keep growing the likeliest branch of the last speculative draft, one
        forward pass per step, up to `limit` tokens; yields (token, distribution).

        Pipelined, the draft would otherwise sit idle once its budget is spent
        and the target is still verifying: these tokens lengthen the next window
        for free when the target accepts the pending one. The distribution is None
        where the draft returns none (draft). halt (a model whose forward takes it):
        a flag that stops a step midway once the scheduler has the target's verdict,
        which ends the extension."""
        branch, rows, dist, choose, keep_rows = self._likeliest
        while branch and len(branch) < limit:         # the cache holds everything before branch[-1]
            logits = self._feed([branch[-1]], self.n_cached, halt)
            if logits is None:
                return
            d = dist(logits)
            branch.append(choose(d))
            rows.append(d)
            yield branch[-1], d if keep_rows else None

    def _extend(self, branch, rows, length, dist, choose, fed_dist=None):
        """Grow `branch` to `length` tokens, one forward pass per token. The cache
        holds everything before branch[-1]; fed_dist, if given, is the distribution
        after branch[-1], which was fed already."""
        while len(branch) < length:
            d = fed_dist if fed_dist is not None else dist(self._feed([branch[-1]], self.n_cached))
            fed_dist = None
            branch.append(choose(d))
            rows.append(d)
        return branch, rows

    def _choose_fn(self, sampling: Sampling):
        """distribution -> token. A distribution is always the one after the cache's
        last token, so the token it draws sits at position n_cached."""
        if sampling.rule is Rule.GREEDY:
            return lambda d: int(np.argmax(d))
        if sampling.rule is Rule.KEYED:
            return lambda d: draw_keyed(d, sampling.seed, self.n_cached)
        return lambda d: sample(d, self.rng)

    @staticmethod
    def _distribution_fn(sampling: Sampling):
        if sampling.rule is not Rule.GREEDY:
            s = sampling
            return lambda logits: probabilities(logits[None, :], s.temperature, s.top_k, s.top_p)[0]
        return np.array   # greedy: the logits (a copy: the model's buffer is reused); argmax is all it needs
