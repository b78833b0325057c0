"""A running request, the one owner of its state: its client, its cache in the target, what the draft's caches hold
of it, its output, statistics, and its part in each step (round.Part). Each kind of part is one method. Alone, a
request follows its mode (core.params.Mode): duodec (duodec_round: the draft drafts the next window while the target
verifies this one), sequential (SpS: draft, then verify) or target (target_step); or it reads its prompt (prefill),
rests while speculating does not pay (rest_step, gate.py), or steps target-only while the draft catches up
(draft_catches_up). In a batch's step (scheduler/batch.py) it is a prompt chunk, a target step or a drafted window.

A draft that restarts, dies, fails or cannot hold the text leaves the request target-only: it loses speed, never
tokens. In a speculative mode prompt lookup (lookup.py) is the second proposer: its free guess is verified in
target-only steps, and after a round's window.

Invariant: the target's cache holds every committed token but the last, so each pass feeds [last committed token] +
window and reads the target's choice at each position of the window and after it. The request's draft cache keeps in
step by longest common prefix (workers/draft/drafter.py), alone and in a batch; what the scheduler believes it holds
(DraftLink.held) decides when it catches up, and a wrong belief costs time, never tokens.
"""
from __future__ import annotations

import functools
import math
import time
from typing import NamedTuple

import numpy as np

from hetspec.core.acceptance import accept_greedy, accept_sampled
from hetspec.core.params import Mode, Speculation
from hetspec.core.sampling import Rule, sample
from hetspec.ipc.messages import BranchPlan
from hetspec.scheduler.decoding.budget import LONG_PROMPT, CostModel, Windows
from hetspec.scheduler.decoding.gate import Gate, Memory
from hetspec.scheduler.decoding.links import DraftLink, TargetLink
from hetspec.scheduler.decoding.lookup import PromptLookup
from hetspec.scheduler.decoding.output import Output
from hetspec.scheduler.decoding.request import Capabilities, Request
from hetspec.scheduler.decoding.round import EMPTY, NO_DRAFT, Draft, NextWindow, Part, Verification, Window
from hetspec.scheduler.decoding.stats import Stats

AHEAD = 256        # tokens the target may decode ahead of a target-only step (Decoder.ahead)
PACE_ROUNDS = 4    # speculative rounds before a request's own pace is trusted over the cost model's (Decoder.pace)


class PrefillPlan(NamedTuple):
    """How the draft catches up with a context (Decoder.plan_draft_prefill)."""
    handover: int      # > 0: it takes the target's cache of this many tokens
    n_tokens: int      # tokens it evaluates itself
    borrow: bool       # on the target's cores too, the target waiting


class Decoder:
    def __init__(self, request: Request, caps: Capabilities, draft: DraftLink, target: TargetLink, output: Output,
                 costs: CostModel | None = None, without_draft: str | None = None, memory: Memory | None = None,
                 cache: int = 0, client=None, target_starts: int = 0):
        self.request, self.caps, self.id, self.params = request, caps, request.id, request.params
        self.draft, self.target, self.out = draft, target, output
        if not self.params.cache_prompt:       # its draft cache keeps no prefix from an earlier request
            draft.forget(cache)
        self.client = client                   # the client's request (clients.Pending): whom to answer, its arrival
        self.cache = cache                     # the target's cache of this request (slots.py)
        self.target_starts = target_starts     # the target's starts at admission: its cache lives in that one
        self.costs = costs                     # None: every round drafts gamma tokens
        self.windows = Windows(request.gamma, request.rebalance, caps.max_gamma, costs, caps.lookup)
        self.lookup = PromptLookup() if caps.lookup and request.params.mode is not Mode.TARGET else None
        self.rng = np.random.default_rng([request.params.seed, 0])
        self.stats = Stats(prior=request.prior, fallback=without_draft)
        self.gate = Gate(memory or Memory(None), forced=request.speculation is Speculation.ALWAYS)
        self.read = 0                          # prompt tokens in the target's cache, until its first token
        self.pending = EMPTY                   # the window drafted beside the last pass, for the next (duodec),
        self.pending_at = 0                    # ... valid while the output is this long
        self.catching_up: PrefillPlan | None = None   # the draft's prefill under way, as planned
        self.rounds_alone = 0                  # rounds alone (not its prompt, not a catch-up): a turn holds one

    @property
    def mode(self) -> Mode:
        """The request's mode; target while it goes on without the draft (stats.fallback says why) or its
        mode is lookup: target-only steps, with lookup guesses (all but mode target's have them)."""
        return self.params.mode if self.stats.fallback is None and self.params.mode.drafts else Mode.TARGET

    def own_part(self) -> Part | None:
        """Alone: its part in the next step, of its next kind (a failing draft leaves it target-only). None: done."""
        while not self.out.done:
            try:
                kind = self.next_part()
                part = kind()
            except Exception as exc:  # noqa: BLE001 - WorkerLost, WorkerError, ContextTooLong name the role
                self.without_draft(exc)
                continue
            if part is not None:
                part.finish = functools.partial(self._finish_own, part.finish, kind)
                return part
        return None

    def _finish_own(self, finish, kind, verdict: Verification | None) -> None:
        """A lone part's verdict committed; once done, what the workers still do for it stops."""
        try:
            finish(verdict)
            self.rounds_alone += kind not in (self.prefill, self.draft_catches_up)   # a round
            if self.out.done:
                if self.draft.busy:
                    self.draft.finish_prefill()
                self.draft.settle()
                self.target.settle()
        except Exception as exc:  # noqa: BLE001 - the draft's failures: without_draft raises the others
            self.without_draft(exc)

    def send(self, part: Part) -> None:
        """A lone part's pass, its own command: it may borrow the draft's cores, and run ahead."""
        self.target.start_verify(self.id, self.cache, part.tokens, part.keep, part.rows, self.request.sampling,
                                 bool(part.borrow), part.ahead)

    def next_part(self):
        """The kind of its next part alone: a method that sends its draft's commands and returns the part (None: none)."""
        if self.out.length == self.out.n_prompt:
            return self.prefill
        if self.mode is Mode.TARGET:
            return lambda: self.target_step(alone=True)
        if not self.gate.speculate:            # resting: the draft's next window, if any, is dropped
            return self.rest_step
        if self.draft.busy or not self.draft.ready(self.cache, self.out.context):   # its prefill is under way,
            return self.draft_catches_up                                             # or its cache lags
        return self.duodec_round if self.mode is Mode.DUODEC else self.sequential_round

    def without_draft(self, exc: Exception, passing: bool = False) -> None:
        """The draft failed: the target finishes alone (a verify under way is dropped, unless it is this step's pass)."""
        if getattr(exc, "role", None) != "draft":
            raise exc
        if not passing:
            self.target.discard()
        self.stats.fallback = str(exc)

    def suspend(self) -> None:
        """Another request's turn, or a batch's: the draft's extension and our prefill plan stop."""
        self.draft.settle()
        self.catching_up = None

    # ---- the three kinds of round ----------------------------------------------------

    def duodec_round(self, gamma: int | None = None):
        """One pipelined round: the target verifies the pending window W, and a lookup guess after it, while the draft drafts
        W' after W (alone, branches for W's bonus token); what of W' follows the tokens committed is pending next. Alone with
        nothing pending, a short W is drafted first; in a batch's step W is then empty."""
        started, restart, lone = time.perf_counter(), NO_DRAFT, gamma is None
        limit = self.out.remaining if lone else min(gamma, self.out.remaining)   # (a batch's room: gamma a part)
        pending = (self.pending if self.pending_at == self.out.length else EMPTY).head(limit - 1)
        if lone and not pending:               # nothing to verify: draft a short W first, the target waiting
            pending, restart = self.draft_now(self.windows.restart(self.stats.acceptance, self.pace(),
                                                                   self.out.remaining - 1))
        plan = None
        if lone:                               # W' as branches, as long as the costs say
            gamma = self.windows.pipelined(len(pending), self.stats.acceptance, self.room(len(pending)))
            plan = BranchPlan(self.request.sequences, self.caps.max_sequences, self.stats.acceptance,
                              self.extend_to(len(pending)))
        # a lookup guess after W; in a batch only in a bare step, whose rows it takes (else its guess is a shadow)
        guess = self.guess(min(limit, self.caps.max_gamma + 1) - 1 - len(pending), pending, gamma) \
            if lone or not pending else EMPTY
        window, base = pending.then(guess.tokens), len(self.out.context) + len(pending)

        def finish(verdict: Verification) -> None:
            n_accepted, _, kept = self.accept_and_commit(window, verdict)
            drafted = part.drafted
            if lone:
                self.record(started, pending, verdict, drafted, n_accepted, kept, parallel=True, restart=restart,
                            guessed=len(guess))
            elif len(pending):                 # the batch's pass is priced whole (Batch.finish)
                self.stats.spec_round(verdict.seconds, drafted.seconds, verdict.seconds, len(pending),
                                      min(n_accepted, kept), kept, parallel=True)
            else:                              # a batch's bare step: the target's token after its guess
                self.stats.target_round()
            self.judge_guess(guess, len(pending), n_accepted, kept, in_round=lone or bool(pending))
            if drafted.branches:
                self.stats.sequences_hist[len(drafted.branches)] += 1
            if n_accepted >= len(pending) and not self.out.done:   # else W' was drafted for nothing
                after = drafted.after(self.out.context[base:])   # the target's bonus token picks the branch
                self.stats.branch_hits += after is not None
                self.pending, self.pending_at = after or EMPTY, self.out.length
        part = self.verify_part(window, finish)
        if gamma > 0:
            part.next_window = NextWindow(np.concatenate([self.out.context, pending.tokens]), gamma, plan)
        part.shadow = None if lone or not pending else self.guess(gamma)
        return part

    def sequential_round(self):
        """SpS: draft a window, the target waiting, then verify it and a lookup guess after it."""
        started = time.perf_counter()
        window, drafted = self.draft_now(self.windows.sequential(self.stats.acceptance, self.out.remaining - 1))
        guess = self.guess(self.caps.max_gamma - len(window), window)
        if drafted.branches:
            self.stats.sequences_hist[1] += 1

        def finish(verdict: Verification) -> None:
            n_accepted, _, kept = self.accept_and_commit(window.then(guess.tokens), verdict)
            self.record(started, window, verdict, drafted, n_accepted, kept, parallel=False, guessed=len(guess))
            self.judge_guess(guess, len(window), n_accepted, kept, in_round=True)
        return self.verify_part(window.then(guess.tokens), finish)

    def target_step(self, alone: bool = True, room: int | None = None) -> Part:
        """The target's next token after the lookup guess's tokens it agrees with: a lone request's (alone: perhaps on the
        draft's cores, and often run ahead already; else beside the draft's prefill), or in a batch's step of `room`
        tokens. Finish returns (seconds, tokens committed)."""
        lone = room is None
        started, guess = time.perf_counter(), self.guess(None if lone else room - 1)
        ran = lone and not len(guess) and self.target.running_ahead(self.id, self.cache)

        def finish(verdict: Verification | None) -> tuple[float, int]:
            if ran:
                verdict = self.target.ran_ahead(self.out.context)
                self.stats.ran_ahead += verdict is not None
                if verdict is None:            # the run went from another context: ask
                    self.send(self.verify_part(guess, finish, part.borrow, part.ahead))
                    verdict = self.target.finish_verify(part.rows)
            kept = self.commit_target_step(guess, verdict)
            return time.perf_counter() - started, max(kept, 1)
        borrow = alone and self.caps.alone_borrows_cores if lone else None   # (None: as the batch's pass does)
        part = self.verify_part(guess, finish, borrow, self.ahead(alone))
        if ran:
            part.tokens = None
        return part

    def commit_target_step(self, guess: Window, verdict: Verification) -> int:
        """A target-only step's tokens committed: how many."""
        n_accepted, _, kept = self.accept_and_commit(guess, verdict)
        self.judge_guess(guess, 0, n_accepted, kept, in_round=False)
        self.stats.target_round()
        return kept

    def judge_guess(self, guess: Window, before: int, n_accepted: int, kept: int, in_round: bool) -> None:
        """The target's verdict on a lookup guess verified after `before` drafted tokens, where it got that far."""
        if len(guess) and n_accepted >= before:
            self.lookup.verified(len(guess), n_accepted - before)
            self.stats.guess_judged(len(guess), min(n_accepted, kept) - before, in_round)

    def ahead(self, alone: bool) -> int:
        """Tokens the target may decode ahead after a target-only step, each then a step without a round trip
        (TargetLink.ran_ahead). Not where lookup guesses (a guess stops the run), beside the draft's prefill, nor where
        the scheduler samples (unkeyed)."""
        if not alone or self.lookup is not None or self.request.rule is Rule.UNKEYED:
            return 0
        left = self.out.remaining - 1 if self.mode is Mode.TARGET else min(self.out.remaining, self.gate.rest) - 1
        return max(0, min(left, AHEAD))

    def guess(self, limit: int | None = None, after: Window = EMPTY, gamma: int = 0) -> Window:
        """A lookup guess as long as its hit rate makes pay, at most `limit` tokens: after the context, or after a
        round's window (`after`, in its pass; the draft drafting gamma beside it: Windows.lookup)."""
        room = self.out.remaining - 1 - len(after)
        room = room if limit is None else min(room, limit)
        if self.lookup is None or room <= 0:
            return EMPTY
        return Window(self.lookup.guess(self.out.context, lambda hit_rate: self.windows.lookup(
            hit_rate, room, len(after), self.stats.acceptance, gamma), after.tokens))

    def rest_step(self) -> Part:
        """A target-only step while speculating does not pay (gate.py); after the rest, a probe."""
        step = self.target_step()

        def finish(verdict: Verification | None, target_step=step.finish) -> None:
            seconds, committed = target_step(verdict)
            self.gate.rested(seconds, committed)
            self.stats.rested += committed
            if self.gate.speculate and not self.out.done:
                self.stats.probes += 1
        step.finish = finish
        return step

    # ---- a round's steps -------------------------------------------------------------

    def draft_now(self, gamma: int) -> tuple[Window, Draft]:
        """gamma tokens drafted after the context while the target waits (one sequence; 0: none)."""
        if gamma <= 0:
            return EMPTY, NO_DRAFT
        self.draft.start_window(self.id, self.cache, self.out.context, gamma, self.request.sampling)
        drafted = self.draft.finish_window()
        return drafted.window(0), drafted

    def verify_part(self, window: Window, finish, borrow: bool = False, ahead: int = 0) -> Part:
        """The target's cache holds all but the last committed token: the part feeds it, then the window."""
        tokens = np.concatenate([self.out.context[-1:], window.tokens])
        return Part(self, tokens, len(self.out.context) - 1, window, finish, borrow, ahead)

    def accept_and_commit(self, window: Window, verdict: Verification) -> tuple[int, int, int]:
        """(draft tokens accepted, the target's next token, tokens committed: fewer at a stop)."""
        if self.request.rule is Rule.UNKEYED:
            n_accepted, token = accept_sampled(window.tokens, window.probs, verdict.probs, self.rng)
        else:                                  # the target's own argmax or keyed draws
            n_accepted, token = accept_greedy(window.tokens, verdict.choice)
        before = self.out.length
        self.out.commit([*window.tokens[:n_accepted], token])
        return n_accepted, token, self.out.length - before

    def choose(self, verdict: Verification) -> int:   # the target's own next token after a pass with no window
        return sample(verdict.probs[0], self.rng) if self.request.rule is Rule.UNKEYED else int(verdict.choice[0])

    def record(self, started: float, window: Window, verdict: Verification, drafted: Draft, n_accepted: int,
               kept: int, parallel: bool, restart: Draft = NO_DRAFT, guessed: int = 0) -> None:
        """A lone round's costs and counts; guessed: lookup tokens verified after the window."""
        if self.costs is not None:
            if restart.branches:
                self.costs.observe(len(restart.branches[0]), restart.seconds, 0, 0.0)
            self.costs.observe(sum(len(b) for b in drafted.branches), drafted.seconds, len(window) + guessed + 1,
                               verdict.seconds)
        wall = time.perf_counter() - started
        self.stats.spec_round(wall, drafted.seconds, verdict.seconds,
                              len(window), min(n_accepted, len(window), kept), kept, parallel, restart.seconds)
        self.gate.judge(wall, kept)

    # ---- what the windows depend on --------------------------------------------------

    def room(self, pending: int) -> int:
        """Tokens a window drafted after `pending` ones could still commit (the target's first)."""
        return self.out.remaining - pending - 1

    def pace(self) -> float | None:
        """This request's seconds per committed token in speculative rounds, once enough to go by."""
        if self.stats.spec_rounds < PACE_ROUNDS:
            return None
        return self.stats.round_s / max(self.stats.committed_in_spec_rounds, 1)

    def extend_to(self, pending: int) -> int:
        """How far the draft may grow the next window while the target verifies: free beside a GPU target; beside a CPU one
        it competes for the memory bus (off by default)."""
        return min(self.caps.max_gamma, self.room(pending)) if self.caps.keep_drafting else 0

    # ---- getting started: the prompt, then the draft catching up ---------------------

    def prefill(self, room: int | None = None) -> Part:
        """The prompt through the target: the rest of it alone, else a chunk of `room` tokens in a batch's step; the last
        chunk's answer is the first token. Alone, a long prompt borrows the draft's cores (the draft prefills
        afterwards); a short one leaves them to the draft's prefill beside it."""
        context, read = self.out.context, self.read
        tokens = context[read:] if room is None else context[read:read + room]
        borrow = None
        if room is None:
            borrow = self.caps.borrow_cores and len(tokens) >= LONG_PROMPT
            if self.mode is not Mode.TARGET and not borrow and self.gate.speculate and self.drafting_pays():
                self.draft.start_prefill(self.id, self.cache, context, self.params.seed, self.params.cache_prompt,
                                         borrow_cores=False)

        def finish(verdict: Verification) -> None:
            if read + len(tokens) < len(context):
                self.read += len(tokens)       # a chunk: its answer is not needed
            else:
                self.first_token(verdict)
        return Part(self, tokens, read, EMPTY, finish, borrow)

    def first_token(self, verdict: Verification) -> None:
        """The prompt is read: the target's token after it is the first."""
        self.read = len(self.out.context)
        self.out.commit([self.choose(verdict)])
        self.stats.ttft_s = time.perf_counter() - self.stats.start
        self.gate.start()

    def draft_catches_up(self):
        """The draft's prefill planned and started (unless one began beside the target's); meanwhile target-only steps,
        unless the target waits for it. None: ready."""
        if not self.draft.busy:
            self.catching_up = self.plan_draft_prefill()
            if self.catching_up is None:
                return None
            self.start_draft_prefill(self.catching_up)
        plan = self.catching_up
        target_waits = plan is not None and (plan.borrow or plan.handover > 0)
        if target_waits or self.draft.poll():
            seconds = self.draft.finish_prefill()   # a timed prefill teaches the cost model
            if self.costs is not None and plan is not None and not target_waits:
                self.costs.observe_prefill(plan.n_tokens, seconds)
            self.catching_up = None
            return None
        step = self.target_step(alone=False)
        step.finish = lambda verdict, target_step=step.finish: self.gate.probing(target_step(verdict)[1])
        return step

    def plan_draft_prefill(self) -> PrefillPlan | None:
        """A long prompt's draft prefill takes the target's cache where the draft is a quantized copy of it (kv_handover),
        or borrows its cores where speculating more than doubles the pace. None: it would not pay; the request goes on
        target-only."""
        long_prompt = len(self.out.context) >= LONG_PROMPT
        handover = len(self.out.context) - 1 if self.caps.kv_handover and long_prompt else 0
        n_tokens = 0 if handover else self.draft.to_prefill(self.cache, self.out.context, self.params.cache_prompt)
        if not self.drafting_pays(n_tokens):
            self.stats.fallback = f"the draft's prefill ({n_tokens} tokens) would not pay"
            return None
        borrow = not handover and self.caps.draft_borrows_cores and long_prompt and self.gain() > 2
        return PrefillPlan(handover, n_tokens, borrow)

    def start_draft_prefill(self, plan: PrefillPlan) -> None:
        if plan.handover:                      # the target's cache holds the prompt: a copy of a few ms
            self.target.export_kv(self.id, self.cache, plan.handover)
        self.draft.start_prefill(self.id, self.cache, self.out.context, self.params.seed, self.params.cache_prompt,
                                 borrow_cores=plan.borrow, kv_length=plan.handover)
        self.stats.draft_prompt_kv = "target" if plan.handover else "own"

    def drafting_pays(self, n_prefill: int = 0) -> bool:
        """Whether speculating may beat the target alone after the draft reads n_prefill prompt tokens beside it
        (CostModel.prefill_pays); always where forced, or without a cost model."""
        if self.costs is None or self.request.speculation is Speculation.ALWAYS:
            return True
        return self.costs.prefill_pays(n_prefill, self.out.remaining, self.gain())

    def gain(self) -> float:
        """CostModel.gain at this request's acceptance estimate (no cost model: infinite)."""
        return math.inf if self.costs is None else self.costs.gain(self.caps.max_gamma, self.stats.acceptance)
