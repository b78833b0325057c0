"""Several requests stepped together (continuous batching).

While more than one request is admitted, each step is one target pass over all of
them (VerifyBatch): every request puts in a chunk of its prompt, or its next token
after a lookup guess where it has one (part_of); requests join and
leave between steps. On a CPU a pass over a few tokens costs little more than a
pass over one, since each block of weights is unpacked once for all of them
(e7e822d:docs/performance.md, "Several requests in one target pass"); on a GPU the pass
costs the same up to its width.

A step holds at most [server] batch_tokens tokens: the decoding requests' first,
then prompt chunks in order of arrival, so that a new prompt is read beside the
others' steps instead of stalling them (vLLM's chunked prefill). The answer rows
of a step are shared out so that they fit the target's buffers: a request's guess
shrinks as the batch grows.

The draft drafts for a batch too (Drafts), beside the target's pass as DuoDecoding's
rounds are: each request in a cache of its own in the draft worker
(workers/draft/batch_drafter.py), each draft token one batched step for all of them. The cost
model picks one window for all (CostModel.batch_window): it shrinks as the batch's pass
stops being free, down to none, where every request steps target-only with its lookup
guess. A request's draft cache catches up with its context in the same draft passes (a
prompt just read, a rest just over), a chunk a step, before it drafts.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hetspec.ipc.messages import BatchWindow, VerifyCommand
from hetspec.scheduler.decoding.budget import CostModel
from hetspec.scheduler.decoding.decoder import Decoder
from hetspec.scheduler.decoding.links import DraftLink, TargetLink, WorkerError, WorkerLost
from hetspec.scheduler.decoding.round import EMPTY, Verification, Window

READY_LAG = 16       # a draft cache this many tokens behind its context catches up inside the draft's first step
MIN_CATCH_UP = 16    # tokens of context a draft cache reads at least, a step it catches up beside the pass


@dataclass
class Part:
    """One request's part of a step: tokens run after the first `keep` of its cache; its
    window is a lookup guess, or drafted (then the draft's batch took draft_s seconds)."""
    decoder: Decoder
    tokens: np.ndarray
    keep: int
    guess: Window
    drafted: bool = False
    draft_s: float = 0.0
    shadow: Window | None = None   # a drafting request's lookup guess, never verified: what a step without
                                   # drafts would have kept of it is weighed against drafting (shadow_step)

    @property
    def drafting(self) -> bool:
        """The draft drafts this request's next window beside the step (Drafts.windows)."""
        return self.shadow is not None

    @property
    def rows(self) -> int:
        return len(self.guess) + 1


class Batch:
    def __init__(self, target: TargetLink, batch_tokens: int, rows: int, drafts: Drafts | None = None):
        self.target = target
        self.batch_tokens = batch_tokens   # tokens a step holds: [server] batch_tokens
        self.rows = rows                   # answer rows a step holds: the target's buffers
        self.drafts = drafts               # None: the draft drafts no batch
        self.size = 0                      # requests in the last step

    def plan(self, running: list[Decoder], fault: Callable[[Decoder, Exception], None]) -> list[Part]:
        """Each request's part of the next step, decoding requests first (a drafted window,
        or a lookup guess), then prompts in order of arrival while there is room (at least
        a token for the first). A request whose part raises is handed to fault(decoder,
        exc) and left out."""
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
                parts.append(part_of(r, max(room, 1)))
            except Exception as exc:  # noqa: BLE001 - this request's fault boundary
                fault(r, exc)
                continue
            used += len(parts[-1].tokens)
        return parts

    def start(self, parts: list[Part], borrow_cores: bool) -> None:
        """One pass for all the parts (finish collects it); beside it, the draft drafts the
        next step's windows (Drafts), the draft's cores then not borrowed."""
        commands = [VerifyCommand(p.decoder.id, p.keep, len(p.tokens), p.rows,
                                  p.decoder.request.sampling, cache=p.decoder.cache) for p in parts]
        self.size = len(parts)
        predicted, gamma = self.drafts.plan(parts) if self.drafts is not None else ([], 0)
        self.target.start_batch(commands, [p.tokens for p in parts], borrow_cores and not predicted)
        if predicted:
            self.drafts.start(predicted, gamma)

    def finish(self, parts: list[Part]) -> list[Verification]:
        verdicts = self.target.finish_batch()
        if self.drafts is not None:
            self.drafts.observe(parts, verdicts)
        return verdicts


class Drafts:
    """The draft's part in a batch's steps, pipelined as DuoDecoding's rounds are: while
    the target verifies a step, the draft drafts each request's next window as if the
    step's window will be kept whole, the first drafted token guessing the target's
    bonus token after it. Where it does, the rest is the request's window in the next
    step; where not, the request takes a bare step (its next token), and the draft
    drafts from its new context meanwhile. A request's draft cache that lags (a prompt
    just read, a rest just over) catches up in the same passes of the draft."""

    def __init__(self, draft: DraftLink, costs: CostModel | None, max_gamma: int, available: Callable[[], bool]):
        self.draft, self.costs, self.max_gamma = draft, costs, max_gamma
        self.available = available         # the draft worker is up (not restarting)
        self.epoch = 0                     # the draft worker's caches as of (Decoder.batch_held): a new one
                                           # each time they are lost
        self.sent: list[tuple[Decoder, np.ndarray]] = []   # the draft's batch under way: each request's
                                                           # predicted context
        self.gamma = 0                     # ... and its window (0: it only catches caches up)
        self.next_gamma = 0                # the next window of the requests drafted for in this step

    def windows(self, decoding: list[Decoder], room: int) -> list[Part]:
        """The parts of the requests the draft drafts for in this step, in at most `room`
        tokens: those whose draft cache holds their context, where the cost model finds a
        window that pays (0: none, they step with their lookup guesses). Each one's
        window is the one drafted beside the last pass, where its prediction came true
        (its context is the predicted one and the window's first token: the rest is the
        window), else none: a bare step, whose next token the draft guesses meanwhile."""
        self.caught_up(block=self.gamma > 0)   # windows under way are waited for; a catch-up is not
        drafted = {r.id: _take(r) for r in decoding}   # (each is used once, if at all)
        if self.draft.busy or not self.available():
            return []
        ready = [r for r in decoding if r.drafts_in_batch() and self._lag(r) <= READY_LAG]
        self.next_gamma = self._window(ready, [r for r in decoding if r not in ready], room)
        if self.next_gamma < 1:
            return []
        parts = []
        for r in ready:
            context, (window, seconds) = r.out.context, self._came_true(r, drafted[r.id])
            parts.append(Part(r, np.concatenate([context[-1:], window.tokens]), len(context) - 1, window,
                              drafted=len(window) > 0, draft_s=seconds, shadow=r.guess(self.next_gamma)))
        return parts

    def _came_true(self, r: Decoder, drafted) -> tuple[Window, float]:
        """The window drafted for r beside the last pass, where its prediction came true
        (its context is the predicted one and the drafted first token), and the draft's seconds."""
        if drafted is None:
            return EMPTY, 0.0
        (predicted, tokens, seconds), context = drafted, r.out.context
        if len(context) == len(predicted) + 1 and context[-1] == tokens[0] and np.array_equal(context[:-1], predicted):
            return Window(tokens[1:min(len(tokens), r.out.remaining, self.next_gamma)]), seconds
        return EMPTY, seconds

    def plan(self, parts: list[Part]) -> tuple[list[tuple[Decoder, np.ndarray]], int]:
        """What the draft does beside this step's pass: the next window of each request it
        drafts for, after its context and its part's window (its predicted context), and
        a chunk of the context of each that could draft but whose cache lags, where
        drafting could pay with every cache caught up; ([], 0) where it has nothing to do."""
        if not self.caught_up() or not self.available():
            return [], 0
        predicted = [(p.decoder, np.concatenate([p.decoder.out.context, p.guess.tokens])) for p in parts if p.drafting]
        lagging = [(r, r.out.context) for r in self._lagging(parts)]
        return predicted + lagging, self.next_gamma if predicted else 0

    def _lagging(self, parts: list[Part]) -> list[Decoder]:
        """The decoding requests that could draft but whose cache lags, where drafting could
        pay with every cache caught up."""
        decoding = [p.decoder for p in parts if p.decoder.out.length > p.decoder.out.n_prompt]
        drafting = {p.decoder.id for p in parts if p.drafting}
        could = [r for r in decoding if r.drafts_in_batch()]
        lagging = [r for r in could if r.id not in drafting and self._lag(r) > READY_LAG]
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
        except WorkerLost:                 # the supervisor restarts it; its caches are gone
            self.epoch += 1
            return
        self.sent, self.gamma = predicted, gamma

    def caught_up(self, block: bool = False) -> bool:
        """Whether the draft is free: the batch under way is collected once done (or now,
        blocking); one whose reply was dropped (a request's end drains both links) is over."""
        if self.sent and self.draft.busy:
            try:
                done = block or self.draft.poll()
            except WorkerLost:             # (poll: the link forgets the command)
                self.epoch += 1
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
        """The draft's reply to the batch under way: each window drafted is pending for the
        next step. Where the draft failed or died there is none, and its requests step
        without drafts (a draft's fault never costs a request its tokens)."""
        try:
            reply, drafted = self.draft.finish_batch()
        except (WorkerError, WorkerLost) as exc:
            print(f"hetspec: a batch's draft failed, its requests step target-only: {exc}", file=sys.stderr)
            self.epoch += 1
            return
        for (r, context), tokens, cached in zip(self.sent, drafted, reply.cached):
            r.batch_held = (self.epoch, cached)
            if len(tokens):
                r.batch_drafted = (context, tokens, reply.seconds)
        if self.costs is not None and all(reply.lengths):      # (a batch's catch-up would weigh on its steps)
            self.costs.observe_batch_draft(len(reply.lengths), self.gamma, reply.seconds)

    def _lag(self, r: Decoder) -> int:
        epoch, held = r.batch_held
        return len(r.out.context) - (held if epoch == self.epoch else 0)

    def _window(self, ready: list[Decoder], others: list[Decoder], room: int) -> int:
        """One window for the ready requests: the cost model's (forced to 2 or more where
        every one of them is), without one the smallest of their configured gammas;
        never more than fits in `room` tokens beside the others' next tokens."""
        if not ready:
            return 0
        top = min(self.max_gamma, (room - len(others)) // len(ready))
        if self.costs is None:
            return min(min(r.request.gamma for r in ready), top)
        forced = all(r.gate.forced for r in ready)
        return self.costs.batch_window([r.stats.acceptance for r in ready],
                                       [r.stats.target_step_yield for r in ready],
                                       [r.stats.target_step_yield for r in others], top, forced)


def _take(decoder: Decoder):
    drafted, decoder.batch_drafted = decoder.batch_drafted, None
    return drafted


def part_of(decoder: Decoder, room: int) -> Part:
    """What a request puts in the next step, at most `room` tokens: the next chunk of its
    prompt (each chunk answers for its last token: the last chunk's answer is the first
    token), or its last token after the cached ones and a lookup guess."""
    context = decoder.out.context
    if decoder.out.length == decoder.out.n_prompt:
        return Part(decoder, context[decoder.read:decoder.read + room], decoder.read, EMPTY)
    guess = decoder.guess(room - 1)
    return Part(decoder, np.concatenate([context[-1:], guess.tokens]), len(context) - 1, guess)


def commit(part: Part, verdict: Verification) -> None:
    """The step's verdict on a request's part: its tokens, or how far its prompt is read."""
    decoder = part.decoder
    if part.shadow is not None:
        shadow_step(part, verdict)
    if part.drafted:
        decoder.commit_drafted_step(part.guess, verdict, part.draft_s)
        decoder.stats.batched_rounds += 1
    elif decoder.out.length > decoder.out.n_prompt:
        decoder.commit_target_step(part.guess, verdict)
        decoder.stats.batched_rounds += 1
    elif decoder.read + len(part.tokens) < len(decoder.out.context):
        decoder.read += len(part.tokens)       # a chunk of the prompt: its answer is not needed
    else:
        decoder.first_token(verdict)


def shadow_step(part: Part, verdict: Verification) -> None:
    """How many tokens of a drafting request's lookup guess the target's own tokens in this
    step would have kept (its choices: greedy or keyed, so a guess is judged without being
    verified), for the lookup's hit rates and the yield of a step without drafts
    (Stats.target_step_yield) that the budget weighs drafting against."""
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
    """The target's own tokens after the context, as far as this step shows them: the
    window's tokens it agrees with, then its choice where it first disagrees (or after)."""
    agree = np.flatnonzero(window != choice[:len(window)])
    k = int(agree[0]) if len(agree) else len(window)
    return np.append(window[:k], choice[k])
