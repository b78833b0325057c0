"""The hardware-aware draft budget: pick gamma so drafting the next window
takes about as long as verifying the current one, so neither side idles."""
from __future__ import annotations

import math

CONTENTION = 1.3    # a target step beside a draft prefill takes this much longer: they share the memory bus
LONG_PROMPT = 16    # tokens: a shorter prompt prefills fast, so neither worker borrows the other's cores for it,
                    # and a draft prefill as short costs too little to weigh (prefill_pays) or to time
BATCH_MARGIN = 1.1  # a batch drafts only where the cost model expects this many times the tokens a second of its
                    # steps without drafts: their lookup guesses (uncounted) commit some too, and a batch's draft
                    # step costs more than its calibration (catch-up tokens, a round trip)
WORTH_GUESSING = 0.1  # without measured costs, a lookup token is guessed while it is kept at least this often
                      # (a CPU target's window costs about a tenth of a token more per token)


def choose_gamma(draft_s_per_token: float, verify_s: dict[int, float], max_gamma: int) -> int:
    """Smallest gamma with gamma * t_draft >= t_verify(gamma).

    verify_s maps a verify size (tokens per target pass) to its measured time;
    sizes in between are interpolated linearly, beyond the last extrapolated.
    In a pipelined round the draft makes gamma forward passes while the target
    verifies the last committed token plus the pending window, whose first
    token the target already chose: gamma tokens in all.
    """
    if draft_s_per_token <= 0 or not verify_s:
        raise ValueError("need a positive draft time and at least one verify timing")
    for gamma in range(1, max_gamma + 1):
        if gamma * draft_s_per_token >= interpolate(verify_s, gamma):
            return gamma
    return max_gamma


def monotone(verify_s: dict[int, float]) -> dict[int, float]:
    """Verify timings with each size capped by the fastest larger size: a pass of
    more tokens never costs less, so a smaller size measured slower than a larger
    one was slowed by the machine (a busy neighbour at start-up), not by its size."""
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
    """Tokens worth drafting while the target waits: the j-th is kept with probability
    acceptance**j, and is worth a draft step while that times the pipeline's pace
    (seconds per committed token) beats the step; at most limit."""
    n = 0
    while n < limit and acceptance ** (n + 1) * pace >= draft_s:
        n += 1
    return n


def _committed(acceptance: float, n: int) -> float:
    """Expected tokens a pass verifying n drafted tokens commits: 1 + a + ... + a**n
    (in closed form: the window search runs every round)."""
    if acceptance >= 1:
        return n + 1.0
    return (1 - acceptance ** (n + 1)) / (1 - acceptance)


class CostModel:
    """What a draft token and a verify pass cost, from the start-up measurement,
    kept honest by the rounds' own timings (costs grow with the context and
    drift on a shared machine)."""

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
        """A batch's pass of n_tokens."""
        if n_tokens > 0 and seconds > 0:
            self.batch_scale += self.SMOOTHING * (seconds / self.measured(n_tokens) - self.batch_scale)

    def observe_batch_draft(self, n_requests: int, gamma: int, seconds: float) -> None:
        """A batch's draft: gamma batched draft steps for n_requests."""
        if gamma > 0 and seconds > 0 and self.batch_draft_s:
            ratio = seconds / (gamma * interpolate(self.batch_draft_s, n_requests))
            self.batch_draft_scale += self.SMOOTHING * (ratio - self.batch_draft_scale)

    def batch_window(self, acceptances: list[float], yields: list[float], others: list[float], max_gamma: int,
                     forced: bool = False) -> int:
        """The window each of a batch's drafting requests gets, at their per-token
        acceptances (one length for all: each draft token is one batched draft step for
        all of them), drafted beside a pass (batch.py's Drafts): the one of most committed
        tokens a second. A step lasts the longer of the gamma draft steps and a pass that
        holds every drafting request's gamma tokens (its last token and the window after
        the first drafted one, the bonus token's guess) and the others' next tokens. A
        request's window is there in a step with probability a**gamma (its last one kept
        whole, the bonus token guessed), else it takes a bare step. yields, others: the
        tokens a target-only step commits with its lookup guess, for each drafting request
        (were it not drafting) and each other one. 0 (no drafting) where no window beats steps without drafts by
        BATCH_MARGIN, unless forced (then at least 2, a window of one token). A batch's pass stops being free as
        it grows, and its draft steps grow too: the window shrinks, down to none."""
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
        """Whether the draft should prefill n prompt tokens beside the target, which
        decodes alone meanwhile but CONTENTION times slower, before speculating at
        gain g (CostModel.gain): over prefill time P it loses P * (1 - 1/(g * CONTENTION))
        against the target alone, and speculating wins back (1 - 1/g) of the rest of
        the request's time (docs/design.md). Speculation that is not expected to pay
        never does, however little the draft has to read (a prompt it mostly holds
        already); otherwise a short prefill always goes, and the gate judges."""
        if gain <= 1:
            return False
        if n_tokens < LONG_PROMPT:
            return True
        target_s = self.alone_s()
        lost = n_tokens * self.prefill_s * (1 - 1 / (gain * CONTENTION))
        return lost < remaining * target_s * (1 - 1 / gain)

    def s_per_token(self, gamma: int, acceptance: float) -> float:
        """A pipelined round's expected seconds per committed token: it lasts the
        longer of gamma draft steps and a verify of gamma tokens, and commits
        1 + a + ... + a**(gamma - 1) tokens at per-token acceptance a."""
        round_s = max(gamma * self.draft_s, self._verify(gamma))
        return round_s / _committed(acceptance, gamma - 1)

    def best_sequential(self, max_gamma: int, acceptance: float) -> int:
        """SpS's gamma: the one with the least expected time per committed token.

        A sequential round drafts gamma tokens (gamma draft steps), then verifies
        them with the last committed token (a pass of gamma + 1 tokens), and
        commits 1 + a + ... + a**gamma tokens at per-token acceptance a. The
        pipelined balance point (choose_gamma) is no optimum here: nothing runs
        beside the draft, and a long window costs the target little more than a
        short one, so at high acceptance SpS gains from longer windows
        (e7e822d:docs/performance.md, "SpS window")."""
        def per_token(gamma: int) -> float:
            round_s = gamma * self.draft_s + self._verify(gamma + 1)
            return round_s / _committed(acceptance, gamma)
        return min(range(1, max_gamma + 1), key=per_token)

    def best_pipelined(self, max_gamma: int, acceptance: float) -> int:
        """The pipelined window of least expected time per committed token: a round
        lasts the longer of drafting n tokens and verifying them (with the last
        committed token), and commits 1 + a + ... + a**n tokens. Where verifying
        costs little more for a longer window this is the balance point; where it
        costs much more (a large output layer on a CPU) and acceptance is modest,
        a shorter window commits nearly as much for far less (docs/design.md, "Never
        slower than the target alone").

        A round after a rejection asks twice with the same costs (its restart's window,
        then the next window): the last answer is kept for the same question."""
        question = (max_gamma, acceptance, self.draft_s, self.verify_scale)
        if self._best_pipelined[0] != question:
            terms = self._terms(acceptance, max_gamma)
            self._best_pipelined = (question, min(range(1, max_gamma + 1),
                                                  key=lambda n: self._pipelined_s(n, acceptance, terms)))
        return self._best_pipelined[1]

    def best_lookup(self, max_tokens: int, acceptance: float) -> int:
        """A target-only step's guess length: the one of least expected time per
        committed token (a pass of k + 1 tokens commits 1 + a + ... + a**k), 0..max_tokens."""
        return min(range(max_tokens + 1),
                   key=lambda k: self._verify(k + 1) / _committed(acceptance, k))

    def gain(self, max_gamma: int, acceptance: float) -> float:
        """Speculation's expected pace over the target alone's, at the best pipelined window.
        The target alone may take the draft's cores too, and then a pipelined round,
        each worker on its own cores, must beat that pace, not the one-core token's."""
        best = self._pipelined_s(self.best_pipelined(max_gamma, acceptance), acceptance)
        return self.alone_s() / best

    def alone_s(self) -> float:
        """A token of the target alone, on every core it takes so."""
        return self._verify(1) * self.alone_pace

    def covering(self, gamma: int, pending: int) -> int:
        """Draft for as long as the target will take to verify the last committed token
        plus the pending window, at most gamma. After a rejection (nothing pending)
        that is a short draft, not a full gamma the target would wait for."""
        return max(1, min(gamma, math.ceil(self._verify(pending + 1) / self.draft_s)))

    def _terms(self, acceptance: float, top: int) -> tuple[list[float], list[float], list[float]]:
        """acceptance ** k, _committed(acceptance, k) and _verify(k) for k = 0 .. top + 1: what
        _pipelined_s reads, worked out once for a search over every window length."""
        ks = range(top + 2)
        return [acceptance ** k for k in ks], [_committed(acceptance, k) for k in ks], [self._verify(k) for k in ks]

    def _pipelined_s(self, n: int, acceptance: float, terms: tuple | None = None) -> float:
        """Seconds per committed token of pipelined rounds whose draft windows hold n
        tokens: the first guesses the target's bonus token, so a round verifies the
        n - 1 others. A round that keeps its whole window and whose bonus token the
        draft guessed hands the next one a window drafted meanwhile; any other is
        followed by a restart round, whose r tokens are drafted while the target
        waits (Windows.restart). The two kinds alternate as a two-state chain, and
        its stationary mix weighs them. terms: _terms(acceptance, n or more)."""
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
        """A verify pass of n tokens as measured at start-up (interpolated), worked out once
        per size: the windows' searches ask for every size, every round, and the measured
        points never change."""
        seconds = self._interpolated.get(n)
        if seconds is None:
            seconds = self._interpolated[n] = interpolate(self.verify_s, n)
        return seconds


class Windows:
    """One request's draft windows, each round's gamma: its budget, as the engine's
    costs (CostModel) and the request's own rounds say. Every window length the
    decoder uses comes from here."""

    def __init__(self, gamma: int, rebalance: bool, max_gamma: int, costs: CostModel | None, max_lookup: int = 0):
        self.gamma, self.rebalance, self.max_gamma, self.costs = gamma, rebalance, max_gamma, costs
        self.max_lookup = max_lookup

    def pipelined(self, pending: int, acceptance: float, room: int) -> int:
        """The next window, drafted while the target verifies `pending` tokens: gamma,
        or less when the target will be done sooner (CostModel.covering), and no more
        than `room`, what could still be committed after the pending window and the
        target's own next token (0: drafting would be wasted). With an automatic
        budget gamma is only where the first round starts: the rounds' own timings
        then set each length, up to max_gamma."""
        gamma = self.max_gamma if self.rebalance else self.gamma
        if self.costs is not None:
            if self.rebalance:
                gamma = self.costs.best_pipelined(gamma, acceptance)
            gamma = self.costs.covering(gamma, pending)
        return min(gamma, room)

    def sequential(self, acceptance: float, room: int) -> int:
        """SpS: with an automatic budget, the window of least expected time per token
        (CostModel.best_sequential): no verify runs alongside to be matched."""
        gamma = self.gamma
        if self.rebalance and self.costs is not None:
            gamma = self.costs.best_sequential(self.max_gamma, acceptance)
        return min(gamma, room)

    def restart(self, acceptance: float, pace: float | None, room: int) -> int:
        """How many tokens to draft, the target waiting, before a verify pass that
        would otherwise have no window (the first round, and the round after a
        rejection or a missed branch): such a pass commits one token for the cost
        of a whole window. Each token costs a draft step and its j-th is accepted
        with probability acceptance**j: draft it while that beats the pipeline's
        own pace (seconds per committed token: this request's rounds', or the cost
        model's before there are enough), up to the pipelined window less one and
        `room`. Without a cost model every window is a full one. With an automatic
        budget the pipelined window is the cost model's (best_pipelined), not the
        start-up gamma: where drafting never catches up with a verify, that is
        max_gamma, and restarts as long would make the target wait for them."""
        window = self.gamma
        if self.rebalance and self.costs is not None:
            window = self.costs.best_pipelined(self.max_gamma, acceptance)
        limit = min(window - 1, room)
        if self.costs is None or limit <= 0:
            return max(limit, 0)
        pace = pace if pace is not None else self.costs.s_per_token(window, acceptance)
        return restart_tokens(acceptance, pace, self.costs.draft_s, limit)

    def lookup(self, acceptance: float, room: int) -> int:
        """How many lookup tokens a target-only step may guess (lookup.py), at most
        max_lookup and `room`: the length of least expected time per token from the
        costs; without them (a configured gamma), every token kept with probability
        at least WORTH_GUESSING."""
        k = self.max_lookup
        if k > 0 and self.costs is not None:
            k = self.costs.best_lookup(k, acceptance)
        elif k > 0 and acceptance < 1:
            k = min(k, int(math.log(WORTH_GUESSING) / math.log(acceptance)) if acceptance > 0 else 0)
        return max(0, min(k, room))
