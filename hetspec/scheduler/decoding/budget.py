"""The draft budget: pick gamma so drafting the next window takes about as long as verifying the current one."""
from __future__ import annotations

import math

CONTENTION = 1.3    # a target step beside a draft prefill takes this much longer: they share the memory bus
LONG_PROMPT = 16    # tokens: a shorter prefill is too cheap to share cores for, to weigh (prefill_pays) or to time
BATCH_MARGIN = 1.1  # a batch drafts only where the cost model expects this many times the rate without drafts: their
                    # uncounted lookup guesses commit too, and a batched draft step costs more than calibrated
WORTH_GUESSING = 0.1  # without measured costs, a lookup token is guessed while it is kept at least this often


def choose_gamma(draft_s_per_token: float, verify_s: dict[int, float], max_gamma: int) -> int:
    """Smallest gamma with gamma * t_draft >= t_verify(gamma): in a pipelined round the draft makes gamma passes
    while the target verifies gamma tokens (the last committed one, and the pending window less its first)."""
    if draft_s_per_token <= 0 or not verify_s:
        raise ValueError("need a positive draft time and at least one verify timing")
    for gamma in range(1, max_gamma + 1):
        if gamma * draft_s_per_token >= interpolate(verify_s, gamma):
            return gamma
    return max_gamma


def monotone(verify_s: dict[int, float]) -> dict[int, float]:
    """Each size capped by the fastest larger one: a pass measured slower than a longer one was slowed by a neighbour."""
    fixed, fastest = {}, float("inf")
    for n in sorted(verify_s, reverse=True):
        fastest = min(fastest, verify_s[n])
        fixed[n] = fastest
    return dict(sorted(fixed.items()))


def interpolate(points: dict[int, float], x: int) -> float:
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    if x <= xs[0]:
        lo, hi = xs[0], xs[1]
    elif x >= xs[-1]:
        lo, hi = xs[-2], xs[-1]
    else:
        hi = next(v for v in xs if v >= x)
        lo = max(v for v in xs if v < x) if hi != x else hi
        if lo == hi:
            return points[hi]
    slope = (points[hi] - points[lo]) / (hi - lo)
    return points[lo] + slope * (x - lo)


def restart_tokens(acceptance: float, pace: float, draft_s: float, limit: int) -> int:
    """Tokens worth drafting while the target waits: the j-th (kept with probability acceptance**j) while that
    times pace (seconds per committed token) beats a draft step; at most limit."""
    n = 0
    while n < limit and acceptance ** (n + 1) * pace >= draft_s:
        n += 1
    return n


def _committed(acceptance: float, n: int) -> float:
    """Expected tokens a pass verifying n drafted ones commits: 1 + a + ... + a**n, in closed form."""
    if acceptance >= 1:
        return n + 1.0
    return (1 - acceptance ** (n + 1)) / (1 - acceptance)


class CostModel:
    """Draft and verify costs: measured at start-up, tracked by the rounds (costs grow with the context, and drift)."""

    SMOOTHING = 0.2

    def __init__(self, draft_s_per_token: float, verify_s: dict[int, float], prefill_s_per_token: float = 0.0,
                 alone_pace: float = 1.0):
        self.draft_s = draft_s_per_token
        self.verify_s = dict(verify_s)
        self.verify_scale = 1.0
        self._interpolated: dict[int, float] = {}   # interpolate(verify_s, n) by n (measured()'s)
        self._best_pipelined: tuple = (None, 0)      # (question, answer) of the last best_pipelined
        self.prefill_s = prefill_s_per_token or draft_s_per_token   # per draft prompt token (untimed: a step)
        self.alone_pace = alone_pace    # a token of the target alone over one on its own cores (it may take the draft's)
        self.batch_draft_s: dict[int, float] = {}   # requests -> a batched draft step (DraftBatch), calibrated
        self.batch_draft_scale = 1.0    # ... as the batches' own drafts since found it
        self.batch_scale = 1.0          # a batch's pass over the verify curve's pass of as many tokens

    def observe(self, n_draft: int, draft_s: float, n_verify: int, verify_s: float) -> None:
        if n_draft > 0 and draft_s > 0:
            self.draft_s += self.SMOOTHING * (draft_s / n_draft - self.draft_s)
        if n_verify > 0 and verify_s > 0:
            ratio = verify_s / self.measured(n_verify)
            self.verify_scale += self.SMOOTHING * (ratio - self.verify_scale)

    def observe_batch(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0 and seconds > 0:
            self.batch_scale += self.SMOOTHING * (seconds / self.measured(n_tokens) - self.batch_scale)

    def observe_batch_draft(self, n_requests: int, gamma: int, seconds: float) -> None:
        """A batch's draft: gamma batched draft steps for n_requests."""
        if gamma > 0 and seconds > 0 and self.batch_draft_s:
            ratio = seconds / (gamma * interpolate(self.batch_draft_s, n_requests))
            self.batch_draft_scale += self.SMOOTHING * (ratio - self.batch_draft_scale)

    def batch_window(self, acceptances: list[float], yields: list[float], others: list[float], max_gamma: int,
                     forced: bool = False) -> int:
        """The one window length, for all of a batch's drafting requests (one batched draft step per token), of most
        committed tokens a second. A step lasts the longer of gamma draft steps and a pass of every drafting request's
        gamma tokens and the others' next ones; a request's window is there with probability a**gamma (its last kept
        whole, the bonus token guessed), else its step is bare. yields, others: what a target-only step commits with
        its lookup guess, per drafting and per other request. 0 unless a window beats no drafting by BATCH_MARGIN;
        forced: at least 2 (one token). As a batch grows its pass stops being free and its draft steps slow: windows
        shrink, down to none."""
        n = len(acceptances)
        if not n or not self.batch_draft_s or max_gamma < 1:
            return 0
        step_s = self.batch_draft_scale * interpolate(self.batch_draft_s, n)

        def rate(gamma: int) -> float:
            if gamma == 0:
                return (sum(yields) + sum(others)) / (self.batch_scale * self.measured(len(others) + n))
            tokens = sum(a ** gamma * _committed(a, gamma - 1) + 1 - a ** gamma for a in acceptances)
            seconds = max(gamma * step_s, self.batch_scale * self.measured(len(others) + n * gamma))
            return (tokens + sum(others)) / seconds
        best = max(range(min(2, max_gamma), max_gamma + 1), key=rate)   # (1: the bonus token's guess alone)
        return best if forced or rate(best) >= BATCH_MARGIN * rate(0) else 0

    def observe_prefill(self, n_tokens: int, seconds: float) -> None:
        if n_tokens >= LONG_PROMPT and seconds > 0:
            self.prefill_s += self.SMOOTHING * (seconds / n_tokens - self.prefill_s)

    def prefill_pays(self, n_tokens: int, remaining: int, gain: float) -> bool:
        """Whether the draft should prefill n prompt tokens beside the target (decoding alone meanwhile, CONTENTION
        times slower) before speculating at gain g: over prefill time P it loses P * (1 - 1/(g * CONTENTION)), and
        speculating wins back (1 - 1/g) of the request's remaining time (docs/design.md). Never where speculation is
        not expected to pay, however little there is to read; otherwise a short prefill always goes, the gate judges."""
        if gain <= 1:
            return False
        if n_tokens < LONG_PROMPT:
            return True
        target_s = self.alone_s()
        lost = n_tokens * self.prefill_s * (1 - 1 / (gain * CONTENTION))
        return lost < remaining * target_s * (1 - 1 / gain)

    def s_per_token(self, gamma: int, acceptance: float) -> float:
        """A pipelined round's expected seconds per committed token: the longer of gamma draft steps and a verify
        of gamma tokens, over the 1 + a + ... + a**(gamma - 1) tokens it commits."""
        round_s = max(gamma * self.draft_s, self._verify(gamma))
        return round_s / _committed(acceptance, gamma - 1)

    def best_sequential(self, max_gamma: int, acceptance: float) -> int:
        """SpS's gamma of least expected time per committed token: gamma draft steps, then a pass of gamma + 1 tokens
        committing 1 + a + ... + a**gamma. Not choose_gamma's balance point: nothing runs beside the draft, and a
        longer window costs the target little more, so at high acceptance longer windows win."""
        def per_token(gamma: int) -> float:
            round_s = gamma * self.draft_s + self._verify(gamma + 1)
            return round_s / _committed(acceptance, gamma)
        return min(range(1, max_gamma + 1), key=per_token)

    def best_pipelined(self, max_gamma: int, acceptance: float) -> int:
        """The pipelined window of least expected time per committed token (_pipelined_s): the balance point where a
        longer verify costs little more, shorter where it costs much more (a large output layer on a CPU) at modest
        acceptance (docs/design.md). Memoized: a round after a rejection asks twice with the same costs."""
        question = (max_gamma, acceptance, self.draft_s, self.verify_scale)
        if self._best_pipelined[0] != question:
            terms = self._terms(acceptance, max_gamma)
            self._best_pipelined = (question, min(range(1, max_gamma + 1),
                                                  key=lambda n: self._pipelined_s(n, acceptance, terms)))
        return self._best_pipelined[1]

    def best_lookup(self, max_tokens: int, hit_rate: float, pending: int = 0, acceptance: float = 1.0,
                    beside_s: float = 0.0) -> int:
        """A lookup guess's length (0..max_tokens) of most committed tokens a second, each kept with probability
        hit_rate: in a target-only step, or after a round's window of `pending` drafted ones, where it counts only if
        the window is kept whole (acceptance ** pending). A pass lasts the longer of itself and what runs beside it
        (beside_s: the draft's next window), so beside a GPU's flat pass a guess costs nothing: all that fit."""
        base, reach = _committed(acceptance, pending), acceptance ** pending

        def rate(k: int) -> float:
            return (base + reach * (_committed(hit_rate, k) - 1)) / max(beside_s, self._verify(pending + 1 + k))
        return max(range(max_tokens + 1), key=rate)

    def gain(self, max_gamma: int, acceptance: float) -> float:
        """Speculation's expected pace at the best pipelined window over the target alone's (which may take all cores)."""
        best = self._pipelined_s(self.best_pipelined(max_gamma, acceptance), acceptance)
        return self.alone_s() / best

    def alone_s(self) -> float:
        """A token of the target alone, on every core it takes so."""
        return self._verify(1) * self.alone_pace

    def covering(self, gamma: int, pending: int) -> int:
        """Draft as long as the target takes to verify the last committed token and the pending window, at most
        gamma: after a rejection (nothing pending), a short draft, not a full gamma the target would wait for."""
        return max(1, min(gamma, math.ceil(self._verify(pending + 1) / self.draft_s)))

    def _terms(self, acceptance: float, top: int) -> tuple[list[float], list[float], list[float]]:
        """acceptance ** k, _committed(acceptance, k) and _verify(k) for k = 0 .. top + 1, once per window search."""
        ks = range(top + 2)
        return [acceptance ** k for k in ks], [_committed(acceptance, k) for k in ks], [self._verify(k) for k in ks]

    def _pipelined_s(self, n: int, acceptance: float, terms: tuple | None = None) -> float:
        """Seconds per committed token of pipelined rounds of n-token windows, the first token guessing the target's
        bonus token (a round verifies the other n - 1). A round keeping its whole window and guessing the bonus token
        hands the next a window drafted meanwhile; any other is followed by a restart round of r tokens drafted while
        the target waits (Windows.restart): a two-state chain, weighed by its stationary mix. terms: _terms(a, >= n)."""
        a = acceptance
        powers, committed, verify = terms or self._terms(a, n)
        full_s, full_n = max(n * self.draft_s, verify[n]), committed[n - 1]
        if a >= 1:
            return full_s / full_n
        r = restart_tokens(a, full_s / full_n, self.draft_s, n - 1)
        restart_s, restart_n = r * self.draft_s + verify[r + 1], committed[r]
        to_full, to_restart = powers[r + 1], 1 - powers[n]     # each kind's chance of being followed by the other
        return (to_full * full_s + to_restart * restart_s) / (to_full * full_n + to_restart * restart_n)

    def _verify(self, n: int) -> float:
        """A verify pass of n tokens, as measured and scaled by the rounds since."""
        return self.verify_scale * self.measured(n)

    def measured(self, n: int) -> float:
        """A verify pass of n tokens as measured at start-up, interpolated once per size (asked for every round)."""
        seconds = self._interpolated.get(n)
        if seconds is None:
            seconds = self._interpolated[n] = interpolate(self.verify_s, n)
        return seconds


class Windows:
    """One request's draft windows: every window length the decoder uses comes from here (the costs, its rounds)."""

    def __init__(self, gamma: int, rebalance: bool, max_gamma: int, costs: CostModel | None, max_lookup: int = 0):
        self.gamma, self.rebalance, self.max_gamma, self.costs = gamma, rebalance, max_gamma, costs
        self.max_lookup = max_lookup

    def pipelined(self, pending: int, acceptance: float, room: int) -> int:
        """The next window, drafted while the target verifies `pending` tokens: gamma, less where the target will be
        done sooner (CostModel.covering), at most `room` (what could still commit after the pending window and the
        target's next token; 0: drafting would be wasted). With an automatic budget gamma only starts the first
        round; the rounds' timings then set each length, up to max_gamma."""
        gamma = self.max_gamma if self.rebalance else self.gamma
        if self.costs is not None:
            if self.rebalance:
                gamma = self.costs.best_pipelined(gamma, acceptance)
            gamma = self.costs.covering(gamma, pending)
        return min(gamma, room)

    def sequential(self, acceptance: float, room: int) -> int:
        """SpS: with an automatic budget, the window of least expected time per token (no verify runs alongside)."""
        gamma = self.gamma
        if self.rebalance and self.costs is not None:
            gamma = self.costs.best_sequential(self.max_gamma, acceptance)
        return min(gamma, room)

    def restart(self, acceptance: float, pace: float | None, room: int) -> int:
        """Tokens to draft, the target waiting, before a pass that would otherwise verify no window (the first round,
        after a rejection or a missed branch) and commit one token for a whole window's cost. The j-th is kept with
        probability acceptance**j: draft it while that beats the pipeline's pace (this request's rounds', else the cost
        model's), up to the pipelined window less one and `room`. With an automatic budget that window is
        best_pipelined's: the start-up gamma is max_gamma where drafting never catches up, too long to wait for."""
        window = self.gamma
        if self.rebalance and self.costs is not None:
            window = self.costs.best_pipelined(self.max_gamma, acceptance)
        limit = min(window - 1, room)
        if self.costs is None or limit <= 0:
            return max(limit, 0)
        pace = pace if pace is not None else self.costs.s_per_token(window, acceptance)
        return restart_tokens(acceptance, pace, self.costs.draft_s, limit)

    def lookup(self, hit_rate: float, room: int, pending: int = 0, acceptance: float = 1.0, gamma: int = 0) -> int:
        """Lookup tokens to guess (lookup.py), at most max_lookup and `room`: in a target-only step, or after a round's
        window of `pending` drafted ones, the draft drafting gamma beside the pass (CostModel.best_lookup); without
        measured costs (a configured gamma), while each is kept with probability at least WORTH_GUESSING."""
        k = self.max_lookup
        if k > 0 and self.costs is not None:
            k = self.costs.best_lookup(min(k, max(room, 0)), hit_rate, pending, acceptance, gamma * self.costs.draft_s)
        elif k > 0 and hit_rate < 1:
            k = min(k, int(math.log(WORTH_GUESSING) / math.log(hit_rate)) if hit_rate > 0 else 0)
        return max(0, min(k, room))
