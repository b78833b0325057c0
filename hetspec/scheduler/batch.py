"""A step of the scheduler's loop: one target pass for the parts (round.Part) of every
running request, whatever their number (continuous batching).

  plan     each request's part: alone, its own kind (Decoder.own_part); beside others,
           a prompt chunk, a target step with its lookup guess, or a window drafted
           beside the last pass (Drafts)
  start    the target's pass sent (a lone part: its own command; several: VerifyBatch),
           the draft drafting beside it
  finish   the verdicts collected
  commit   each part's verdict, as its kind commits it

A pass over a few tokens costs little more than a pass over one (a CPU unpacks each
block of weights once for all; a GPU's pass is flat up to its width). A step holds at
most [server] batch_tokens: the decoding requests' tokens first, then prompt chunks in
order of arrival (chunked prefill), within the target's answer rows.

A batch's draft (Drafts) runs beside its pass as DuoDecoding's rounds do: each request
in its own draft cache, the one it drafts in alone (workers/draft/batch_drafter.py), one
window for all (CostModel.batch_window), none where the pass stops being free.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import numpy as np

from hetspec.core.params import Mode
from hetspec.core.sampling import Rule
from hetspec.ipc.messages import BatchWindow, VerifyCommand
from hetspec.scheduler.decoding.budget import CostModel
from hetspec.scheduler.decoding.decoder import Decoder
from hetspec.scheduler.decoding.links import DraftLink, TargetLink, WorkerError, WorkerLost
from hetspec.scheduler.decoding.round import EMPTY, Part, Verification, Window

MIN_CATCH_UP = 16    # tokens of context a draft cache reads at least, a step it catches up beside the pass


class Batch:
    def __init__(self, target: TargetLink, batch_tokens: int, rows: int, drafts: Drafts | None = None):
        self.target = target
        self.batch_tokens = batch_tokens   # tokens a step holds: [server] batch_tokens
        self.rows = rows                   # answer rows a step holds: the target's buffers
        self.drafts = drafts               # None: the draft drafts no batch
        self.size = 0                      # requests in the last step of several
        self.alone = False                 # the step is a lone request's

    def plan(self, running: list[Decoder], fault: Callable[[Decoder, Exception], None]) -> list[Part]:
        """Each request's part of the next step: alone, its own; else decoding requests first,
        then prompts while there is room. One whose part raises goes to fault(decoder, exc)."""
        self.alone = len(running) == 1
        return _own(running[0], fault) if self.alone else self._together(running, fault)

    def _together(self, running: list[Decoder], fault: Callable[[Decoder, Exception], None]) -> list[Part]:
        decoding = [r for r in running if r.out.length > r.out.n_prompt]
        reading = sorted((r for r in running if r.out.length == r.out.n_prompt),
                         key=lambda r: r.client.arrived)
        room = min(self.rows, self.batch_tokens)
        drafted = self.drafts.windows(decoding, room) if self.drafts is not None else []
        share = max(1, (room - sum(len(p.tokens) for p in drafted)) // max(len(running) - len(drafted), 1))
        parts, used = list(drafted), sum(len(p.tokens) for p in drafted)
        for r in decoding + reading:
            if any(p.decoder is r for p in drafted):
                continue
            room = share if r in decoding else self.batch_tokens - used
            if room <= 0 and r is not reading[0]:
                continue                       # no room for its prompt this step
            try:
                parts.append(_part(r, max(room, 1)))
            except Exception as exc:  # noqa: BLE001 - this request's fault boundary
                fault(r, exc)
                continue
            used += len(parts[-1].tokens)
        return parts

    def start(self, parts: list[Part], borrow_cores: bool) -> None:
        """One pass for all the parts: alone, the part's own command; else one VerifyBatch,
        the draft drafting the next step's windows beside it (its cores then not borrowed)."""
        if self.alone:
            if parts[0].tokens is not None:
                parts[0].decoder.send(parts[0])
            return
        self.size = len(parts)
        commands = [VerifyCommand(p.decoder.id, p.keep, len(p.tokens), p.rows,
                                  p.decoder.request.sampling, cache=p.decoder.cache) for p in parts]
        predicted, gamma = self.drafts.plan(parts) if self.drafts is not None else ([], 0)
        self.target.start_batch(commands, [p.tokens for p in parts], borrow_cores and not predicted)
        if predicted:
            self.drafts.start(predicted, gamma)

    def commit(self, part: Part, verdict: Verification | None) -> None:
        """The step's verdict on a request's part, committed as its kind does."""
        decoder = part.decoder
        batched = not self.alone and decoder.out.length > decoder.out.n_prompt
        if part.shadow is not None:
            shadow_step(part, verdict)
        part.finish(verdict)
        decoder.stats.batched_rounds += batched

    def finish(self, parts: list[Part]) -> list[Verification | None]:
        if self.alone:                     # (None: it ran ahead; its finish takes the token)
            return [None if parts[0].tokens is None else self.target.finish_verify(parts[0].rows)]
        verdicts = self.target.finish_batch()
        if self.drafts is not None:
            self.drafts.observe(parts, verdicts)
        return verdicts


class Drafts:
    """The draft's part in a batch's steps: while the target verifies a step, the draft
    drafts each request's next window as if the step's will be kept whole, its first
    token guessing the bonus token. Where it does, the rest is the next step's window;
    else the request takes a bare step. A lagging draft cache catches up in the same passes."""

    def __init__(self, draft: DraftLink, costs: CostModel | None, max_gamma: int, available: Callable[[], bool]):
        self.draft, self.costs, self.max_gamma = draft, costs, max_gamma
        self.available = available         # the draft worker is up (not restarting)
        self.sent: list[tuple[Decoder, np.ndarray]] = []   # the draft's batch under way: each request's
                                                           # predicted context
        self.gamma = 0                     # ... and its window (0: it only catches caches up)
        self.next_gamma = 0                # the next window of the requests drafted for in this step

    def windows(self, decoding: list[Decoder], room: int) -> list[Part]:
        """The parts of the requests drafted for in this step, in `room` tokens: those whose
        draft cache holds their context, where the cost model finds a window that pays.
        Each one's window is the one drafted beside the last pass, if its prediction came
        true; else a bare step."""
        self.caught_up(block=self.gamma > 0)   # windows under way are waited for; a catch-up is not
        drafted = {r.id: _take(r) for r in decoding}   # (each is used once, if at all)
        if self.draft.busy or not self.available():
            return []
        ready = [r for r in decoding if _drafts_for(r) and self.draft.ready(r.cache, r.out.context)]
        self.next_gamma = self._window(ready, [r for r in decoding if r not in ready], room)
        if self.next_gamma < 1:
            return []
        parts = []
        for r in ready:
            context, (window, seconds) = r.out.context, self._came_true(r, drafted[r.id])
            parts.append(Part(r, np.concatenate([context[-1:], window.tokens]), len(context) - 1, window,
                              functools.partial(_commit_drafted, r, window, seconds),
                              shadow=r.guess(self.next_gamma)))
        return parts

    def _came_true(self, r: Decoder, drafted) -> tuple[Window, float]:
        """(r's window drafted beside the last pass, if its prediction came true; the draft's seconds)."""
        if drafted is None:
            return EMPTY, 0.0
        (predicted, tokens, seconds), context = drafted, r.out.context
        if len(context) == len(predicted) + 1 and context[-1] == tokens[0] and np.array_equal(context[:-1], predicted):
            return Window(tokens[1:min(len(tokens), r.out.remaining, self.next_gamma)]), seconds
        return EMPTY, seconds

    def plan(self, parts: list[Part]) -> tuple[list[tuple[Decoder, np.ndarray]], int]:
        """What the draft does beside this step's pass: (each request and its predicted context:
        its context and its part's window, or a lagging cache's context to catch up; gamma)."""
        if not self.caught_up() or not self.available():
            return [], 0
        predicted = [(p.decoder, np.concatenate([p.decoder.out.context, p.guess.tokens])) for p in parts if p.drafting]
        lagging = [(r, r.out.context) for r in self._lagging(parts)]
        return predicted + lagging, self.next_gamma if predicted else 0

    def _lagging(self, parts: list[Part]) -> list[Decoder]:
        """Requests that could draft but whose cache lags, where drafting would pay once caught up."""
        decoding = [p.decoder for p in parts if p.decoder.out.length > p.decoder.out.n_prompt]
        drafting = {p.decoder.id for p in parts if p.drafting}
        could = [r for r in decoding if _drafts_for(r)]
        lagging = [r for r in could if r.id not in drafting and not self.draft.ready(r.cache, r.out.context)]
        pays = lagging and self._window(could, [r for r in decoding if r not in could],
                                        len(decoding) * (self.max_gamma + 1)) > 0
        return lagging if pays else []

    def start(self, predicted: list[tuple[Decoder, np.ndarray]], gamma: int) -> None:
        """Send the draft its batch (plan's), to run beside the target's pass."""
        windows = [BatchWindow(r.id, r.cache, len(context), r.request.sampling) for r, context in predicted]
        catch_up = MIN_CATCH_UP
        if self.costs is not None:
            catch_up = max(catch_up, int(self.costs.batch_scale * self.costs.measured(len(predicted))
                                         / self.costs.prefill_s) // len(predicted))
        try:
            self.draft.start_batch(windows, [context for _, context in predicted], gamma, catch_up)
        except WorkerLost:                 # the supervisor restarts it; its caches are gone (DraftLink.lost)
            return
        self.sent, self.gamma = predicted, gamma

    def caught_up(self, block: bool = False) -> bool:
        """Whether the draft is free, the batch under way collected once done (or now, blocking)."""
        if self.sent and self.draft.busy:
            try:
                done = block or self.draft.poll()
            except WorkerLost:             # (poll: the link forgets the command, and its caches)
                done = False
            if done:
                self._collect()
        if not self.draft.busy:
            self.sent = []
        return not self.draft.busy

    def settle(self) -> None:
        """The batch is over (a request runs alone): the draft's link is the lone request's again."""
        self.caught_up(block=True)

    def observe(self, parts: list[Part], verdicts: list[Verification]) -> None:
        """The pass's time, for the cost model."""
        if self.costs is not None and verdicts:
            self.costs.observe_batch(sum(len(p.tokens) for p in parts), verdicts[0].seconds)

    def _collect(self) -> None:
        """Each window of the batch under way is pending for the next step; where the draft
        failed there is none, and its requests step without drafts."""
        try:
            reply, drafted = self.draft.finish_batch()
        except (WorkerError, WorkerLost) as exc:
            print(f"hetspec: a batch's draft failed, its requests step target-only: {exc}", file=sys.stderr)
            return
        for (r, context), tokens in zip(self.sent, drafted):
            if len(tokens):
                r.batch_drafted = (context, tokens, reply.seconds)
        if self.costs is not None and all(reply.lengths):      # (a batch's catch-up would weigh on its steps)
            self.costs.observe_batch_draft(len(reply.lengths), self.gamma, reply.seconds)

    def _window(self, ready: list[Decoder], others: list[Decoder], room: int) -> int:
        """One window for the ready requests: the cost model's (without one, the smallest
        configured gamma), fitting `room` tokens beside the others' next tokens."""
        if not ready:
            return 0
        top = min(self.max_gamma, (room - len(others)) // len(ready))
        if self.costs is None:
            return min(min(r.request.gamma for r in ready), top)
        forced = all(r.gate.forced for r in ready)
        return self.costs.batch_window([r.stats.acceptance for r in ready],
                                       [r.stats.target_step_yield for r in ready],
                                       [r.stats.target_step_yield for r in others], top, forced)


def _own(r: Decoder, fault: Callable[[Decoder, Exception], None]) -> list[Part]:
    """A lone request's part, of its own kind (none if it raised, or is done)."""
    try:
        part = r.own_part()
    except Exception as exc:  # noqa: BLE001 - this request's fault boundary
        fault(r, exc)
        return []
    return [] if part is None else [part]


def _part(r: Decoder, room: int) -> Part:
    """A request's part in a batch's step of `room` tokens: a prompt chunk, or a target step."""
    return r.prefill(room) if r.out.length == r.out.n_prompt else r.target_step(alone=False, room=room)


def _drafts_for(r: Decoder) -> bool:
    """Whether a batch may draft for r: speculating, and not unkeyed (a batch's draft has no probabilities)."""
    return (r.caps.batch_drafts and r.mode is not Mode.TARGET and r.gate.speculate
            and r.request.rule is not Rule.UNKEYED)


def _commit_drafted(r: Decoder, window: Window, draft_s: float, verdict: Verification) -> None:
    """A drafted request's step: its window (none: a bare step)."""
    if not len(window):
        r.commit_target_step(window, verdict)
        return
    n_accepted, _, kept = r.accept_and_commit(window, verdict)
    r.stats.spec_round(verdict.seconds, draft_s, verdict.seconds, len(window), min(n_accepted, kept), kept,
                       parallel=True)


def _take(decoder: Decoder):
    drafted, decoder.batch_drafted = decoder.batch_drafted, None
    return drafted


def shadow_step(part: Part, verdict: Verification) -> None:
    """How much of a drafting request's lookup guess the target's tokens in this step would
    have kept (judged unverified), for the lookup's hit rates and Stats.target_step_yield,
    which the budget weighs drafting against."""
    guess, decoder = part.shadow.tokens, part.decoder
    targets = _target_path(part.guess.tokens, verdict.choice)
    n = len(guess)
    mismatch = np.flatnonzero(guess[:len(targets)] != targets[:n])
    kept = int(mismatch[0]) if len(mismatch) else min(n, len(targets))
    if n:
        decoder.lookup.verified(n, kept)
    decoder.stats.shadow_rounds += 1
    decoder.stats.shadow_accepted += kept


def _target_path(window: np.ndarray, choice: np.ndarray) -> np.ndarray:
    """The target's own tokens as far as this step shows them."""
    agree = np.flatnonzero(window != choice[:len(window)])
    k = int(agree[0]) if len(agree) else len(window)
    return np.append(window[:k], choice[k])
