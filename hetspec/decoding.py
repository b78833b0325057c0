"""The decoding loop of one request: DuoDecoding (DESIGN.md section 2), and the
sequential and target-only baselines through the same workers.

Invariant: the target's KV cache holds every committed token but the last,
so each verify pass feeds [last committed token] + pending window W and reads
the target's choice at every position of W and after it.

A DuoDecoding round, with both workers busy at once:
  target: verify [last] + W                   draft: draft the next window W'
                                                      after committed + W, as
                                                      branches for its first token
                                                      (its budget spent, it keeps
                                                      growing the likeliest branch
                                                      until the verdict is in)
  then reconcile: W rejected at i -> commit W[:i] + the target's correction,
                  drop W'; W accepted -> commit W + the target's next token t,
                  and the branch of W' that starts with t becomes the new W.
With nothing pending (the first round, after a rejection, or when t matched no
branch) the draft first drafts a short W while the target waits (a restart).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from hetspec.acceptance import accept_greedy, accept_sampled, sample
from hetspec.acceptance_prior import GENERIC
from hetspec.branches import pick_branch
from hetspec.budget import CostModel, restart_length
from hetspec.output import Output
from hetspec.worker_links import Draft, DraftLink, Sampling, TargetLink, Verification

EMPTY = np.zeros(0, dtype=np.int32)
NO_DRAFT = Draft([], None, 0.0)
BORROW_MIN_PROMPT = 16   # shorter prompts prefill fast anyway: both workers prefill at once
PRIOR_WEIGHT = 5         # tokens' worth of belief in the acceptance prior


@dataclass
class Policy:
    mode: str                  # "duodec", "sequential" or "target"
    gamma: int
    sequences: int | str
    max_sequences: int
    sampling: Sampling
    seed: int
    seeded: bool = False       # the caller gave the seed: the run must be reproducible
    borrow_cores: bool = True  # the target prefills on the draft's cores too
    cache_prompt: bool = True  # the draft may keep a matching prefix from an earlier request
    draft_borrows_cores: bool = True  # the draft prefills on the target's cores too, the target waiting
    keep_drafting: bool = False  # the draft grows the next window until the target's verdict is in
    max_window: int = 0        # ... up to this many tokens (the shared buffers' size)
    rebalance: bool = False    # gamma "auto": each round's length from the costs, past gamma too (see _draft_length,
    #                            _sequential_round)
    kv_handover: bool = False  # the draft takes the target's cache of a long prompt instead of prefilling it
    acceptance_prior: float = GENERIC  # where the acceptance estimate starts (the engine's past requests, when online)

    @property
    def timing_may_shape_windows(self) -> bool:
        """Greedy output never depends on where windows start; a seeded sampling
        run does, and must be reproducible, so its windows must not follow timing."""
        return self.sampling.greedy or not self.seeded


@dataclass
class Stats:
    start: float = field(default_factory=time.perf_counter)
    ttft_s: float = 0.0
    rounds: int = 0             # verify passes after the prefill
    spec_rounds: int = 0        # ... of which verified a draft window
    target_only_rounds: int = 0  # ... decoded by the target alone while the draft prefilled
    drafted: int = 0            # draft tokens verified
    accepted: int = 0           # ... and accepted
    rejections: int = 0         # windows cut short by a rejected token
    committed_in_spec_rounds: int = 0
    branch_hits: int = 0        # pipelined windows whose branch the target's token picked
    draft_s: float = 0.0
    verify_s: float = 0.0
    round_s: float = 0.0        # wall time of speculative rounds
    busy_s: float = 0.0         # ... of which a worker computed: the longer side, or both in sequence
    sequences_hist: Counter = field(default_factory=Counter)
    draft_prompt_kv: str = "own"  # how the draft got the prompt's cache: its own prefill, or the "target"'s
    prior: float = GENERIC

    @property
    def acceptance(self) -> float:
        """Per-token acceptance so far (accepted / tokens decided), from the prior."""
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.accepted + self.rejections + PRIOR_WEIGHT)

    def spec_round(self, wall: float, draft_s: float, verify_s: float, drafted: int, accepted: int,
                   committed: int, parallel: bool, serial_draft_s: float = 0.0) -> None:
        """serial_draft_s: drafting the target waited for before the round (SpS-style)."""
        self.rounds += 1
        self.busy_s += serial_draft_s + (max(draft_s, verify_s) if parallel else draft_s + verify_s)
        self.spec_rounds += 1
        self.round_s += wall
        self.draft_s += serial_draft_s + draft_s
        self.verify_s += verify_s
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += accepted < drafted
        self.committed_in_spec_rounds += committed


class Decoder:
    def __init__(self, request_id: int, policy: Policy, draft: DraftLink, target: TargetLink, output: Output,
                 costs: CostModel | None = None):
        self.id = request_id
        self.policy = policy
        self.sampling = policy.sampling
        self.draft = draft
        self.target = target
        self.out = output
        self.rng = np.random.default_rng([policy.seed, 0])
        self.stats = Stats(prior=policy.acceptance_prior)
        self.costs = costs                     # None: every round drafts gamma tokens

    # ---- the loop ------------------------------------------------------------

    def run(self, emit) -> Stats:
        """Decode until a stop condition; emit(tokens, text) once a round's tokens
        are committed (a pipelined round's, once the next round has started)."""
        self._prefill(emit)
        self._draft_catches_up(emit)
        window, window_probs = EMPTY, None
        while not self.out.done:
            if self.policy.mode == "sequential":
                self._sequential_round()
                emit(*self.out.take_round())
            else:
                window, window_probs = self._duodec_round(window, window_probs, emit)
        emit(*self.out.take_round())
        self.draft.settle()
        return self.stats

    def _prefill(self, emit) -> None:
        """The prompt through the target; its first token is the time to first token."""
        borrow = self.policy.borrow_cores and len(self.out.context) >= BORROW_MIN_PROMPT
        self.target.start_verify(self.id, self.out.context, 0, 1, self.sampling, borrow_cores=borrow)
        if self.policy.mode != "target" and not borrow:
            self.draft.start_prefill(self.id, self.out.context, self.policy.seed, self.policy.cache_prompt,
                                     borrow_cores=False)
        self.out.commit([self._choose(self.target.finish_verify(1, self.sampling), 0)])
        self.stats.ttft_s = time.perf_counter() - self.stats.start
        emit(*self.out.take_round())

    def _draft_catches_up(self, emit) -> None:
        """The draft prefills the prompt; speculation starts once it is ready.

        A long prompt's draft prefill borrows the target's cores while the target
        waits: speculation then starts about twice as soon, which beats the few
        tokens the target would decode alone on its own core meanwhile. Without
        borrowing, the target decodes alone until the draft is ready. In "target"
        mode the target decodes everything alone. When the draft is a quantized
        copy of the target (kv_handover), it takes the target's cache of the
        prompt instead of computing its own.

        How many tokens the target decodes alone depends on timing, and with it
        where windows start; a seeded sampling run must not depend on timing, so
        it waits for the draft instead (greedy output never depends on windows)."""
        wait_for_draft = False
        if self.policy.mode != "target" and not self.draft.busy and not self.out.done:
            long_prompt = len(self.out.context) >= BORROW_MIN_PROMPT
            handover = len(self.out.context) - 1 if self.policy.kv_handover and long_prompt else 0
            if handover:       # the target's cache holds the prompt: the draft takes it, a copy of a few ms
                self.target.export_kv(self.id, handover)
            borrowed = not handover and self.policy.draft_borrows_cores and long_prompt
            self.draft.start_prefill(self.id, self.out.context, self.policy.seed, self.policy.cache_prompt,
                                     borrow_cores=borrowed, kv_length=handover)
            wait_for_draft = borrowed or handover > 0
            self.stats.draft_prompt_kv = "target" if handover else "own"
        overlap = not wait_for_draft and self.policy.timing_may_shape_windows
        while not self.out.done and (self.policy.mode == "target" or (overlap and not self.draft.poll())):
            self._start_verify(EMPTY)
            self.out.commit([self._choose(self.target.finish_verify(1, self.sampling), 0)])
            self.stats.rounds += 1
            self.stats.target_only_rounds += 1
            emit(*self.out.take_round())
        if self.draft.busy:
            self.draft.finish_draft(self.sampling)

    def _duodec_round(self, window: np.ndarray, window_probs, emit):
        started = time.perf_counter()
        restart = NO_DRAFT
        if len(window) == 0:
            window, window_probs, restart = self._restart_window()
        context = self.out.context
        n_draft = self._draft_length(len(window))
        # Between two rounds both workers wait for the scheduler, so it starts them
        # first, and only then streams the last round's tokens; it commits this
        # round's as soon as the target's verdict is in, while the draft may
        # still be drafting.
        if n_draft > 0:
            self.draft.start_draft(self.id, np.concatenate([context, window]), n_draft, True, self.policy.sequences,
                                   self.policy.max_sequences, self.sampling, self.policy.seed, self.stats.acceptance,
                                   self._extend_to(len(window)))
        self._start_verify(window)
        emit(*self.out.take_round())
        verification = self.target.finish_verify(len(window) + 1, self.sampling)
        n_accepted, token, kept = self._accept_and_commit(window, window_probs, verification)
        draft = self.draft.finish_draft(self.sampling) if n_draft > 0 else NO_DRAFT
        self._record_round(started, window, verification, draft, n_accepted, kept, True, restart)
        if draft.branches:
            self.stats.sequences_hist[len(draft.branches)] += 1
        if n_accepted < len(window) or self.out.done:
            return EMPTY, None                 # rejected (or finished): the next window was drafted for nothing
        chosen = pick_branch(draft.branches, token)
        if chosen is None:
            return EMPTY, None
        self.stats.branch_hits += 1
        probs = None if draft.probs is None else draft.probs[chosen][1:]
        return draft.branches[chosen][1:], probs

    def _restart_window(self) -> tuple[np.ndarray, np.ndarray | None, Draft]:
        """With nothing pending (the first round, or after a rejection or a missed
        branch), a verify pass would commit one token for the cost of a window.
        The target waits instead while the draft drafts a short window, as in
        SpS, and the pass verifies it at almost no extra cost; the pipeline
        resumes behind it."""
        return self._draft_window(self._restart_length())

    def _sequential_round(self) -> None:
        """Ordinary speculative decoding (SpS): draft gamma tokens, then verify them,
        never both at once. With an automatic budget each round takes the gamma
        of least expected time per token (budget.sequential_gamma), not the
        pipelined balance point: no verify runs alongside to be matched."""
        started = time.perf_counter()
        gamma = self.policy.gamma
        if self.policy.rebalance and self.costs is not None:
            gamma = self.costs.sequential_gamma(self.policy.max_window, self.stats.acceptance,
                                                self.policy.timing_may_shape_windows)
        window, window_probs, draft = self._draft_window(min(gamma, self.out.remaining - 1))
        if draft.branches:
            self.stats.sequences_hist[1] += 1
        self._start_verify(window)
        verification = self.target.finish_verify(len(window) + 1, self.sampling)
        n_accepted, _, kept = self._accept_and_commit(window, window_probs, verification)
        self._record_round(started, window, verification, draft, n_accepted, kept, False)

    def _draft_window(self, n: int) -> tuple[np.ndarray, np.ndarray | None, Draft]:
        """n tokens drafted after the committed context while the target waits
        (one branch, its first token a draft guess too): (window, its draft
        probabilities when sampling, the draft); nothing if n is 0."""
        if n <= 0:
            return EMPTY, None, NO_DRAFT
        self.draft.start_draft(self.id, self.out.context, n, False, 1, 1, self.sampling, self.policy.seed)
        draft = self.draft.finish_draft(self.sampling)
        return draft.branches[0], (draft.probs[0] if draft.probs else None), draft

    def _start_verify(self, window: np.ndarray) -> None:
        """The target's cache holds all but the last committed token: feed it, then the window."""
        context = self.out.context
        self.target.start_verify(self.id, np.concatenate([context[-1:], window]), len(context) - 1,
                                 len(window) + 1, self.sampling)

    def _accept_and_commit(self, window, window_probs, verification: Verification) -> tuple[int, int, int]:
        """(draft tokens accepted, the target's own token, tokens actually committed:
        fewer if EOS, a stop string or the limit came first)."""
        n_accepted, token = self._accept(window, window_probs, verification)
        before = self.out.length
        self.out.commit([*window[:n_accepted], token])
        return n_accepted, token, self.out.length - before

    def _record_round(self, started: float, window, verification: Verification, draft: Draft, n_accepted: int,
                      kept: int, parallel: bool, restart: Draft = NO_DRAFT) -> None:
        if self.costs is not None:
            if restart.branches:
                self.costs.observe(len(restart.branches[0]), restart.seconds, 0, 0.0)
            self.costs.observe(sum(len(b) for b in draft.branches), draft.seconds, len(window) + 1,
                               verification.seconds)
        self.stats.spec_round(time.perf_counter() - started, draft.seconds, verification.seconds,
                              len(window), min(n_accepted, kept), kept, parallel, restart.seconds)

    # ---- small decisions -------------------------------------------------------

    def _draft_length(self, pending: int) -> int:
        """gamma, or less when the target will be done sooner (see CostModel), and
        no more than could still be committed after the pending window and the
        target's own next token (0: drafting would be wasted).

        With an automatic budget, gamma is only where the first round starts: the
        start-up measurement put it at the balance point, where a little drift
        (longer contexts, a busy neighbour) leaves the draft short and the target
        waiting for it. The rounds' own timings then set it (up to max_window)."""
        gamma = self.policy.max_window if self.policy.rebalance else self.policy.gamma
        if self.costs is not None:
            gamma = self.costs.draft_length(gamma, pending, self.policy.timing_may_shape_windows)
        return min(gamma, self.out.remaining - pending - 1)

    def _restart_length(self) -> int:
        """See budget.restart_length: up to a pipelined window (gamma - 1 tokens),
        paced by this request's rounds so far, or by the cost model before there
        are any and whenever timing must not shape windows."""
        limit = min(self.policy.gamma - 1, self.out.remaining - 1)
        if self.costs is None or limit <= 0:
            return max(limit, 0)               # no cost model: every window is a full one
        online = self.policy.timing_may_shape_windows
        acceptance = self.stats.acceptance
        if online and self.stats.spec_rounds >= 4:
            pace = self.stats.round_s / max(self.stats.committed_in_spec_rounds, 1)
        else:
            pace = self.costs.s_per_token(self.policy.gamma, acceptance, online)
        _, draft_s = self.costs.rates(online)
        return restart_length(acceptance, draft_s, pace, limit)

    def _extend_to(self, pending: int) -> int:
        """How far the draft may grow the next window while the target verifies:
        the budget is what the draft must deliver, the rest uses time it would
        sit idle (free beside a GPU target; on a CPU one it competes for the
        memory bus, hence off there by default). Not for a seeded sampling run,
        whose windows must not depend on timing; never past what could still
        be committed."""
        if not (self.policy.keep_drafting and self.policy.timing_may_shape_windows):
            return 0
        return min(self.policy.max_window, self.out.remaining - pending - 1)

    def _accept(self, window, window_probs, verification: Verification) -> tuple[int, int]:
        if self.sampling.greedy:
            return accept_greedy(window, verification.choice)
        return accept_sampled(window, window_probs, verification.probs, self.rng)

    def _choose(self, verification: Verification, row: int) -> int:
        if self.sampling.greedy:
            return int(verification.choice[row])
        return sample(verification.probs[row], self.rng)
