"""The decoding loop of one request, round by round, in one of three explicit modes
(core.params.Mode), while it runs alone (scheduler/turns.py):

  duodec      DuoDecoding: the draft drafts the next window while the target
              verifies the current one (duodec_round);
  sequential  ordinary speculative decoding (SpS): draft, then verify (sequential_round);
  target      the target alone, one token a pass (target_step).

A request also runs target-only while the draft worker is restarting, and
finishes so if the draft dies under it, fails a command, or if its text
outgrows a draft of another vocabulary: it loses speed, never tokens. It
rests, running target-only rounds, while speculating does not pay (gate.py).
In a speculative mode a target-only round also verifies a free prompt-lookup
guess (lookup.py); in mode target it is the plain target, one token a pass.
The draft is a DraftLink, or a BridgedDraft for another vocabulary (bridge.py):
same methods. Every window length comes from budget.Windows. What a round passes
around, and the words for it (window, branch, accepted, bonus token): round.py.

Beside other requests, a request takes steps of a batch instead (scheduler/batch.py):
a chunk of its prompt (read), a window drafted for the batch (commit_drafted_step)
or a target-only step (guess, commit_target_step).

Invariant: the target's KV cache holds every committed token but the last,
so each verify pass feeds [last committed token] + pending window W and reads
the target's choice at every position of W and after it. The draft keeps its
own cache in step by longest common prefix (workers/draft/drafter.py), so the
loop never tracks it.
"""
from __future__ import annotations

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
from hetspec.scheduler.decoding.round import EMPTY, NO_DRAFT, Draft, Verification, Window
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
                 cache: int = 0):
        self.request, self.caps, self.id, self.params = request, caps, request.id, request.params
        self.draft, self.target, self.out = draft, target, output
        self.cache = cache                     # the target's cache of this request (requests take turns)
        self.costs = costs                     # None: every round drafts gamma tokens
        self.windows = Windows(request.gamma, request.rebalance, caps.max_gamma, costs, caps.lookup)
        self.lookup = PromptLookup() if caps.lookup and request.params.mode is not Mode.TARGET else None
        self.rng = np.random.default_rng([request.params.seed, 0])
        self.stats = Stats(prior=request.prior, fallback=without_draft)
        self.gate = Gate(memory or Memory(None), forced=request.speculation is Speculation.ALWAYS)
        self.draft_ready = False               # the draft's cache holds this request's context
        self.read = 0                          # prompt tokens in the target's cache, until its first token
        self.emit = None

    @property
    def mode(self) -> Mode:
        """The request's mode, or target while it goes on without the draft (stats.fallback says why)."""
        return Mode.TARGET if self.stats.fallback is not None else self.params.mode

    def rounds(self, emit):
        """Decode until a stop condition, a round per step; emit(tokens, text) streams committed
        tokens. Between steps the scheduler may give other requests turns (suspend). If the
        draft dies, fails a command, or cannot hold the context, the target finishes alone: a
        verify it was running is dropped (the next pass crops the cache to the committed tokens)."""
        self.emit = emit
        try:
            yield from self.decode()
            if self.draft.busy:                # a prefill begun beside the target's, for a request done at once
                self.draft.finish_prefill()
        except Exception as lost:              # WorkerLost, WorkerError, bridge.ContextTooLong: they name the role
            if getattr(lost, "role", None) != "draft":
                raise
            self.target.discard()
            self.stats.fallback = str(lost)
            yield from self.decode()
        self.emit_round()
        self.draft.settle()
        self.target.settle()
        return self.stats

    def suspend(self) -> None:
        """Another request's turn: the draft will hold its context (the target keeps ours in our slot)."""
        self.draft.settle()
        self.draft_ready = False

    def decode(self):
        if self.out.length == self.out.n_prompt:
            self.prefill()
        pending = EMPTY
        while not self.out.done:
            if self.mode is Mode.TARGET:
                self.target_step(alone=True)
            elif not self.gate.speculate:      # resting: the draft's next window, if any, is dropped
                pending = EMPTY
                self.rest_step()
            elif not self.draft_ready:         # first, after a rest, or after another request's turn
                pending = EMPTY
                self.draft_catches_up()
                continue                       # a turn holds a round, not only the draft catching up
            elif self.mode is Mode.DUODEC:
                pending = self.duodec_round(pending)
            else:
                self.sequential_round()
            yield

    # ---- the three kinds of round ----------------------------------------------------

    def duodec_round(self, pending: Window) -> Window:
        """One pipelined round: the target verifies the pending window W while the draft
        drafts W' after it (branches for W's bonus token); returns the next W."""
        started, restart = time.perf_counter(), NO_DRAFT
        if not pending:                        # nothing to verify: draft a short W first, the target waiting
            pending, restart = self.draft_now(self.windows.restart(self.stats.acceptance, self.pace(),
                                                                   self.out.remaining - 1))
        gamma = self.windows.pipelined(len(pending), self.stats.acceptance, self.room(len(pending)))
        if gamma > 0:                          # W' as if W will be accepted
            plan = BranchPlan(self.request.sequences, self.caps.max_sequences, self.stats.acceptance,
                              self.extend_to(len(pending)))
            self.draft.start_window(self.id, np.concatenate([self.out.context, pending.tokens]), gamma,
                                    self.request.sampling, plan)
        self.start_verify(pending)             # both workers busy: stream the last round's tokens meanwhile
        self.emit_round()
        verdict = self.target.finish_verify(len(pending) + 1)
        if gamma > 0:
            self.draft.halt()                  # its extension can stop: what it has drafted is all W' takes
        n_accepted, token, kept = self.accept_and_commit(pending, verdict)
        drafted = self.draft.finish_window() if gamma > 0 else NO_DRAFT
        self.record(started, pending, verdict, drafted, n_accepted, kept, parallel=True, restart=restart)
        if drafted.branches:
            self.stats.sequences_hist[len(drafted.branches)] += 1
        if n_accepted < len(pending) or self.out.done:
            return EMPTY                       # W rejected (or done): W' was drafted for nothing
        after = drafted.branch_after(token)    # the target's bonus token picks W's successor
        if after is None:
            return EMPTY
        self.stats.branch_hits += 1
        return after

    def sequential_round(self) -> None:
        """SpS: draft a window, the target waiting, then verify it."""
        started = time.perf_counter()
        window, drafted = self.draft_now(self.windows.sequential(self.stats.acceptance, self.out.remaining - 1))
        if drafted.branches:
            self.stats.sequences_hist[1] += 1
        self.start_verify(window)
        self.emit_round()                      # the last round's tokens, while the target computes
        verdict = self.target.finish_verify(len(window) + 1)
        n_accepted, _, kept = self.accept_and_commit(window, verdict)
        self.record(started, window, verdict, drafted, n_accepted, kept, parallel=False)

    def target_step(self, alone: bool) -> tuple[float, int]:
        """A target-only round (target mode and rests: alone, on the draft's cores too
        where allowed; or while the draft prefills): the target's next token, after as
        many tokens of a lookup guess as it agrees with. Without a guess, the target has
        often decoded it already, ahead (Decoder.ahead): no round trip. Returns (seconds,
        tokens committed)."""
        started = time.perf_counter()
        guess, verdict = self.guess(), None
        if not len(guess) and self.target.running_ahead(self.id, self.cache):
            self.emit_round()                  # the last round's tokens, while the target computes ahead
            verdict = self.target.ran_ahead(self.out.context)
            self.stats.ran_ahead += verdict is not None
        if verdict is None:                    # a guess to verify, or no token decoded ahead: ask
            self.start_verify(guess, borrow=alone and self.caps.alone_borrows_cores, ahead=self.ahead(alone))
            self.emit_round()                  # the last round's tokens, while the target computes
            verdict = self.target.finish_verify(len(guess) + 1)
        kept = self.commit_target_step(guess, verdict)
        return time.perf_counter() - started, max(kept, 1)

    def commit_target_step(self, guess: Window, verdict: Verification) -> int:
        """A target-only round's tokens: as many of the guess as the target agrees with,
        then its own; returns the tokens committed."""
        n_accepted, _, kept = self.accept_and_commit(guess, verdict)
        if len(guess):
            self.lookup.verified(len(guess), n_accepted)
            self.stats.lookup_guessed += len(guess)
            self.stats.lookup_accepted += min(n_accepted, kept)
        self.stats.rounds += 1
        self.stats.target_only_rounds += 1
        return kept

    def drafts_in_batch(self) -> bool:
        """Whether a batch's step may draft for it: a speculative mode it does not rest from,
        not the unkeyed rule (a batch's draft returns no probability rows)."""
        return (self.caps.batch_drafts and self.mode is not Mode.TARGET and self.gate.speculate
                and self.request.rule is not Rule.UNKEYED)

    def commit_drafted_step(self, window: Window, verdict: Verification, draft_s: float) -> int:
        n_accepted, _, kept = self.accept_and_commit(window, verdict)   # drafted beside a batch's last pass
        self.stats.spec_round(verdict.seconds, draft_s, verdict.seconds, len(window),
                              min(n_accepted, kept), kept, parallel=True)
        return kept

    def ahead(self, alone: bool) -> int:
        """Tokens the target may decode ahead after a target-only step, each then a step
        without a round trip (links.TargetLink.ran_ahead), to the end of the request or
        the rest. Not where lookup guesses: a guess stops the run, and its pass under way
        is lost (measured: docs/performance.md); not beside the draft's prefill, nor where
        the scheduler samples (the unkeyed rule)."""
        if not alone or self.lookup is not None or self.request.rule is Rule.UNKEYED:
            return 0
        left = self.out.remaining - 1 if self.mode is Mode.TARGET else min(self.out.remaining, self.gate.rest) - 1
        return max(0, min(left, AHEAD))

    def guess(self, limit: int | None = None) -> Window:
        """A lookup guess for a target-only round (lookup.py), as long as its hit rate
        makes pay, of at most `limit` tokens; none in mode target."""
        if self.lookup is None or limit == 0:
            return EMPTY
        room = self.out.remaining - 1 if limit is None else min(self.out.remaining - 1, limit)
        return Window(self.lookup.guess(self.out.context, lambda hit_rate: self.windows.lookup(hit_rate, room)))

    def rest_step(self) -> None:
        """A target-only round while speculating does not pay (gate.py); once the rest
        is over, the draft catches up with the context before the next probe."""
        seconds, committed = self.target_step(alone=True)
        self.gate.rested(seconds, committed)
        self.stats.rested += committed
        if self.gate.speculate and not self.out.done:
            self.stats.probes += 1
            self.draft_ready = False

    # ---- a round's steps -------------------------------------------------------------

    def draft_now(self, gamma: int) -> tuple[Window, Draft]:
        """gamma tokens drafted after the committed context while the target waits (one
        plain sequence, its first token a draft guess too); nothing if gamma is 0."""
        if gamma <= 0:
            return EMPTY, NO_DRAFT
        self.draft.start_window(self.id, self.out.context, gamma, self.request.sampling)
        drafted = self.draft.finish_window()
        return drafted.window(0), drafted

    def start_verify(self, window: Window, borrow: bool = False, ahead: int = 0) -> None:
        """The target's cache holds all but the last committed token: feed it, then the window."""
        context = self.out.context
        self.target.start_verify(self.id, self.cache, np.concatenate([context[-1:], window.tokens]),
                                 len(context) - 1, len(window) + 1, self.request.sampling, borrow, ahead)

    def accept_and_commit(self, window: Window, verdict: Verification) -> tuple[int, int, int]:
        """(draft tokens accepted, the target's own next token, tokens actually
        committed: fewer if EOS, a stop string or the limit came first)."""
        if self.request.rule is Rule.UNKEYED:
            n_accepted, token = accept_sampled(window.tokens, window.probs, verdict.probs, self.rng)
        else:                                  # the target's own argmax or keyed draws
            n_accepted, token = accept_greedy(window.tokens, verdict.choice)
        before = self.out.length
        self.out.commit([*window.tokens[:n_accepted], token])
        return n_accepted, token, self.out.length - before

    def choose(self, verdict: Verification) -> int:
        """The target's own next token after a pass with no window."""
        if self.request.rule is Rule.UNKEYED:
            return sample(verdict.probs[0], self.rng)
        return int(verdict.choice[0])

    def emit_round(self) -> None:
        self.emit(*self.out.take_round())

    def record(self, started: float, window: Window, verdict: Verification, drafted: Draft, n_accepted: int,
               kept: int, parallel: bool, restart: Draft = NO_DRAFT) -> None:
        if self.costs is not None:
            if restart.branches:
                self.costs.observe(len(restart.branches[0]), restart.seconds, 0, 0.0)
            self.costs.observe(sum(len(b) for b in drafted.branches), drafted.seconds, len(window) + 1,
                               verdict.seconds)
        wall = time.perf_counter() - started
        self.stats.spec_round(wall, drafted.seconds, verdict.seconds,
                              len(window), min(n_accepted, kept), kept, parallel, restart.seconds)
        self.gate.judge(wall, kept)

    # ---- what the windows depend on --------------------------------------------------

    def room(self, pending: int) -> int:
        """Tokens a window drafted after `pending` ones could still commit (the target's
        own next token comes first)."""
        return self.out.remaining - pending - 1

    def pace(self) -> float | None:
        """This request's seconds per committed token in speculative rounds, once there
        are enough of them to go by."""
        if self.stats.spec_rounds < PACE_ROUNDS:
            return None
        return self.stats.round_s / max(self.stats.committed_in_spec_rounds, 1)

    def extend_to(self, pending: int) -> int:
        """How far the draft may grow the next window while the target verifies: the
        budget is what the draft must deliver, the rest uses time it would sit idle
        (free beside a GPU target; on a CPU one it competes for the memory bus, so
        off there by default); never past what could still be committed."""
        if not self.caps.keep_drafting:
            return 0
        return min(self.caps.max_gamma, self.room(pending))

    # ---- getting started: the prompt, then the draft catching up ---------------------

    def prefill(self) -> None:
        """The prompt through the target; its first token is the time to first token.
        A long prompt borrows the draft's cores (the draft prefills afterwards); a
        short one leaves them, and the draft prefills at the same time."""
        context = self.out.context
        long_prompt = len(context) - self.read >= LONG_PROMPT
        borrow = self.caps.borrow_cores and long_prompt
        self.target.start_verify(self.id, self.cache, context[self.read:], self.read, 1, self.request.sampling,
                                 borrow)       # (the rest of it, if a batch began it: batch.part_of)
        if self.mode is not Mode.TARGET and not borrow and self.gate.speculate and self.drafting_pays():
            self.draft.start_prefill(self.id, context, self.params.seed, self.params.cache_prompt,
                                     borrow_cores=False)
        self.first_token(self.target.finish_verify(1))
        self.emit_round()

    def first_token(self, verdict: Verification) -> None:
        """The prompt is read: the target's token after it is the first."""
        self.read = len(self.out.context)
        self.out.commit([self.choose(verdict)])
        self.stats.ttft_s = time.perf_counter() - self.stats.start
        self.gate.start()

    def draft_catches_up(self) -> None:
        """Speculation starts once the draft holds the context: plan its prefill (or
        go on target-only where it would not pay), start it (unless one began beside
        the target's prompt prefill), and wait for it."""
        plan = None
        if not self.draft.busy and not self.out.done:
            plan = self.plan_draft_prefill()
            if plan is None:
                return
            self.start_draft_prefill(plan)
        self.wait_for_draft(plan)
        self.draft_ready = True

    def plan_draft_prefill(self) -> PrefillPlan | None:
        """A long prompt's draft prefill takes the target's cache outright when the
        draft is a quantized copy of the target (kv_handover), or borrows the target's
        cores while the target waits: it is done twice as soon, which pays where
        speculating more than doubles the pace. None: the prefill would not pay, and
        the request goes on target-only."""
        long_prompt = len(self.out.context) >= LONG_PROMPT
        handover = len(self.out.context) - 1 if self.caps.kv_handover and long_prompt else 0
        n_tokens = 0 if handover else self.draft.to_prefill(self.out.context, self.params.cache_prompt)
        if not self.drafting_pays(n_tokens):
            self.stats.fallback = f"the draft's prefill ({n_tokens} tokens) would not pay"
            return None
        borrow = not handover and self.caps.draft_borrows_cores and long_prompt and self.gain() > 2
        return PrefillPlan(handover, n_tokens, borrow)

    def start_draft_prefill(self, plan: PrefillPlan) -> None:
        if plan.handover:                      # the target's cache holds the prompt: a copy of a few ms
            self.target.export_kv(self.id, self.cache, plan.handover)
        self.draft.start_prefill(self.id, self.out.context, self.params.seed, self.params.cache_prompt,
                                 borrow_cores=plan.borrow, kv_length=plan.handover)
        self.stats.draft_prompt_kv = "target" if plan.handover else "own"

    def wait_for_draft(self, plan: PrefillPlan | None) -> None:
        """The target decodes alone until the draft is ready, unless it waits for it (a
        handed-over cache, borrowed cores); a timed prefill teaches the cost model."""
        target_waits = plan is not None and (plan.borrow or plan.handover > 0)
        while not target_waits and not self.out.done and not self.draft.poll():
            self.gate.probing(self.target_step(alone=False)[1])
        if self.draft.busy:
            seconds = self.draft.finish_prefill()
            if self.costs is not None and plan is not None and not target_waits:
                self.costs.observe_prefill(plan.n_tokens, seconds)

    def drafting_pays(self, n_prefill: int = 0) -> bool:
        """Whether speculating may beat the target alone after the draft first reads
        n_prefill prompt tokens beside it (CostModel.prefill_pays, at this request's
        acceptance estimate). A short prompt's draft prefill, begun beside the
        target's, asks with nothing to read. Always where speculation is forced,
        and without a cost model (a configured gamma)."""
        if self.costs is None or self.request.speculation is Speculation.ALWAYS:
            return True
        return self.costs.prefill_pays(n_prefill, self.out.remaining, self.gain())

    def gain(self) -> float:
        """CostModel.gain at this request's acceptance estimate; infinite without a cost model."""
        return math.inf if self.costs is None else self.costs.gain(self.caps.max_gamma, self.stats.acceptance)
