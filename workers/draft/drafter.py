"""The draft algorithm, over any model with forward(tokens, pos) -> last logits.

The drafter keeps its KV cache in step with the scheduler by longest common
prefix (as llama.cpp's common/speculative.cpp does): each command carries the
whole context, the drafter keeps what matches and evaluates the rest. So the
scheduler never tracks the draft's cache, and tokens the draft has not yet
seen (the target's bonus token, a correction) are fed automatically.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetspec.core.branches import allocate_budget, count_sequences, first_tokens, split_budget
from hetspec.core.params import SamplingParams
from hetspec.core.sampling import draw_keyed, probabilities, sample, softmax
from hetspec.ipc.messages import BranchPlan


@dataclass
class DraftOutput:
    branches: list[list[int]]
    probs: list[np.ndarray] = field(default_factory=list)   # per branch: (len, vocab) rows, for accept_sampled


class Drafter:
    def __init__(self, model, n_ctx: int):
        self.model = model
        self.cached = np.zeros(n_ctx, dtype=np.int32)   # tokens whose KV entries are in the cache
        self.n_cached = 0
        self.rng = np.random.default_rng()
        self._likeliest = ([], [], None, None, False)   # (branch, rows, dist, choose, keep_rows) of the last
                                                        # speculative draft

    # ---- cache bookkeeping -------------------------------------------------

    def _feed(self, tokens, pos: int) -> np.ndarray:
        logits = self.model.forward(tokens, pos)
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

    def draft(self, context: np.ndarray, n_tokens: int, params: SamplingParams,
              plan: BranchPlan | None = None, keyed: bool = False) -> DraftOutput:
        """n_tokens after context: one plain sequence, or with a plan the branches
        of a pipelined window (likeliest first), whose first token the target picks.
        Sampling, each token is the draw at its position (keyed: the same draw the
        target makes, core/sampling.draw_keyed) or the generator's next, and only
        the latter needs the distributions returned (accept_sampled)."""
        sampling, keep_rows = not params.greedy, not params.greedy and not keyed
        dist, choose = self._distribution_fn(params), self._choose_fn(params, keyed)
        first = dist(self.sync(context))
        start = len(context)

        if plan is None:
            self._likeliest = ([], [], None, None, False)
            branch, rows = self._extend([choose(first)], [first], n_tokens, dist, choose)
            return DraftOutput([branch], [rows] if keep_rows else [])

        k = 1 if plan.sequences == "dynamic" else plan.sequences
        candidates = first_tokens(first, min(plan.max_sequences, len(first)))
        if keyed:                              # the target's likeliest draw first
            drawn = choose(first)
            candidates = [drawn] + [c for c in candidates if c != drawn][:len(candidates) - 1]
        second = None
        lengths = split_budget(n_tokens, k)
        if plan.sequences == "dynamic" and n_tokens >= 4 and plan.max_sequences > 1:
            second = dist(self._feed([candidates[0]], start))
            as_probs = (lambda d: d) if sampling else softmax
            first_p = as_probs(first)
            k = count_sequences(first_p, float(as_probs(second).max()), plan.max_sequences)
            lengths = allocate_budget(n_tokens, [float(first_p[c]) for c in candidates[:k]], plan.acceptance)
        branches, rows = [None] * len(lengths), [None] * len(lengths)
        # Alternatives first, the most likely branch last: its KV entries then stay
        # in the cache, ready for the next window when the target picks it.
        for i in range(len(lengths) - 1, -1, -1):
            reuse = second if (i == 0 and len(lengths) == 1) else None
            if reuse is None:
                self.n_cached = start          # rewind: the next forward drops the rest
            branches[i], rows[i] = self._extend([candidates[i]], [first], lengths[i], dist, choose, reuse)
        self._likeliest = (branches[0], rows[0], dist, choose, keep_rows)
        return DraftOutput(branches, rows if keep_rows else [])

    def extend(self, limit: int):
        """Keep growing the likeliest branch of the last speculative draft, one
        forward pass per step, up to `limit` tokens; yields (token, distribution).

        Pipelined, the draft would otherwise sit idle once its budget is spent
        and the target is still verifying: these tokens lengthen the next window
        for free when the target accepts the pending one. The distribution is None
        where the draft returns none (draft)."""
        branch, rows, dist, choose, keep_rows = self._likeliest
        while branch and len(branch) < limit:         # the cache holds everything before branch[-1]
            d = dist(self._feed([branch[-1]], self.n_cached))
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

    def _choose_fn(self, params: SamplingParams, keyed: bool):
        """distribution -> token. A distribution is always the one after the cache's
        last token, so the token it draws sits at position n_cached."""
        if params.greedy:
            return lambda d: int(np.argmax(d))
        if keyed:
            return lambda d: draw_keyed(d, params.seed, self.n_cached)
        return lambda d: sample(d, self.rng)

    @staticmethod
    def _distribution_fn(params: SamplingParams):
        if not params.greedy:
            return lambda logits: probabilities(logits[None, :], params.temperature, params.top_k, params.top_p)[0]
        return np.array   # greedy: the logits (a copy: the model's buffer is reused); argmax is all it needs
