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

import sys
from collections.abc import Callable

import numpy as np

from hetspec.core.params import Mode
from hetspec.core.sampling import Rule
from hetspec.ipc.messages import BatchWindow, VerifyCommand
from hetspec.scheduler.decoding.budget import CostModel
from hetspec.scheduler.decoding.decoder import Decoder
from hetspec.scheduler.decoding.links import DraftLink, TargetLink, WorkerError, WorkerLost
from hetspec.scheduler.decoding.round import Draft, Part, Verification

MIN_CATCH_UP = 16    # tokens of context a draft cache reads at least, a step it catches up beside the pass


class Batch:
    def __init__(self, target: TargetLink, batch_tokens: int, rows: int, drafts: Drafts):
        self.target = target
        self.batch_tokens = batch_tokens   # tokens a step holds: [server] batch_tokens
        self.rows = rows                   # answer rows a step holds: the target's buffers
        self.drafts = drafts
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
        drafted = self.drafts.windows(decoding, room)
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
        """One pass for all the parts, the draft drafting their next windows beside it (its
        cores then not borrowed): alone, the part's own command; else one VerifyBatch."""
        if self.alone:                      # the pass first: the draft's next window has slack, the pass none
            if parts[0].tokens is not None:
                parts[0].decoder.send(parts[0])
            self.drafts.start(parts, alone=True)
            return
        drafting = self.drafts.start(parts, alone=False)
        self.size = len(parts)
        commands = [VerifyCommand(p.decoder.id, p.keep, len(p.tokens), p.rows,
                                  p.decoder.request.sampling, cache=p.decoder.cache) for p in parts]
        self.target.start_batch(commands, [p.tokens for p in parts], borrow_cores and not drafting)

    def finish(self, parts: list[Part]) -> list[Verification | None]:
        """The verdicts (alone, None: it ran ahead; its finish takes the token), then the draft's windows."""
        if self.alone:
            verdicts = [None if parts[0].tokens is None else self.target.finish_verify(parts[0].rows)]
        else:
            verdicts = self.target.finish_batch()
            self.drafts.observe(parts, verdicts)
        self.drafts.collect()
        return verdicts

    def commit(self, part: Part, verdict: Verification | None) -> None:
        """The step's verdict on a request's part, committed as its kind does."""
        decoder = part.decoder
        batched = not self.alone and decoder.out.length > decoder.out.n_prompt
        if part.shadow is not None:
            shadow_step(part, verdict)
        part.finish(verdict)
        decoder.stats.batched_rounds += batched


class Drafts:
    """The draft's part in each step, however many requests it holds: beside the target's
    pass it drafts the next window of each part that asks (Part.next_window, from
    Decoder.duodec_round), alone in the request's own command (DraftWindow: branches, an
    extension, probability rows), for several in one (DraftBatch: one window for all, each
    in its own draft cache). A batch's lagging draft caches catch up in its passes."""

    def __init__(self, draft: DraftLink, costs: CostModel | None, max_gamma: int, available: Callable[[], bool],
                 batches: bool):
        self.draft, self.costs, self.max_gamma = draft, costs, max_gamma
        self.available = available         # the draft worker is up (not restarting)
        self.batches = batches             # it drafts for several requests at once (Capabilities.batch_drafts)
        self.asked: list[Part] = []        # the parts whose windows it drafts beside this step's pass
        self.alone = False                 # ... in a lone request's command
        self.gamma = 0                     # ... a batch's window
        self.catching_up = False           # a batch's catch-up alone is under way (collected once done)

    def windows(self, decoding: list[Decoder], room: int) -> list[Part]:
        """The pipelined rounds of a batch's requests whose draft cache holds their context, in
        `room` tokens, where the cost model finds a window that pays."""
        self.caught_up()
        if not self.batches or self.draft.busy or not self.available():
            return []
        ready = [r for r in decoding if _drafts_for(r) and self.draft.ready(r.cache, r.out.context)]
        gamma = self._window(ready, [r for r in decoding if r not in ready], room)
        return [r.duodec_round(gamma) for r in ready] if gamma > 0 else []

    def start(self, parts: list[Part], alone: bool) -> bool:
        """Send the draft what it drafts beside this step's pass; whether it drafts. Where it
        fails, the parts that asked go on target-only (Decoder.without_draft)."""
        self.asked, self.alone = [p for p in parts if p.next_window is not None], alone
        lagging = self._lagging(parts) if self.batches and not alone and not self.draft.busy else []
        try:
            if alone and self.asked:
                r, window = self.asked[0].decoder, self.asked[0].next_window
                r.draft.start_window(r.id, r.cache, window.context, window.gamma, r.request.sampling, window.plan)
            elif self.asked or lagging:
                self._start_batch(lagging)
        except Exception as exc:  # noqa: BLE001 - the draft's failures: without_draft raises the others
            self._failed(exc, passing=alone)
        return bool(self.asked or self.catching_up)

    def _start_batch(self, lagging: list[Decoder]) -> None:
        """One DraftBatch: the asked windows, and lagging caches catching up (at least MIN_CATCH_UP tokens)."""
        requests = [p.decoder for p in self.asked] + lagging
        contexts = [p.next_window.context for p in self.asked] + [r.out.context for r in lagging]
        catch_up = MIN_CATCH_UP
        if self.costs is not None:
            catch_up = max(catch_up, int(self.costs.batch_scale * self.costs.measured(len(requests))
                                         / self.costs.prefill_s) // len(requests))
        self.gamma = self.asked[0].next_window.gamma if self.asked else 0
        self.draft.start_batch([BatchWindow(r.id, r.cache, len(c), r.request.sampling)
                                for r, c in zip(requests, contexts)], contexts, self.gamma, catch_up)
        self.catching_up = not self.asked

    def collect(self) -> None:
        """Once the verdicts are in: each asking part's window as the draft returned it."""
        asked, self.asked = self.asked, []
        if not asked:
            return
        try:
            if self.alone:
                link = asked[0].decoder.draft
                link.halt()                    # its extension can stop: what it has drafted is all W' takes
                asked[0].drafted = link.finish_window()
                return
            reply, drafted = self.draft.finish_batch()
        except Exception as exc:  # noqa: BLE001 - as in start
            self._failed(exc, asked)
            return
        for part, tokens in zip(asked, drafted):
            if len(tokens):                    # (none: its cache was still catching up)
                part.drafted = Draft([tokens], None, reply.seconds)
        if self.costs is not None and all(reply.lengths):      # (a batch's catch-up would weigh on its steps)
            self.costs.observe_batch_draft(len(reply.lengths), self.gamma, reply.seconds)

    def _failed(self, exc: Exception, asked: list[Part] | None = None, passing: bool = False) -> None:
        for part in self.asked if asked is None else asked:
            part.decoder.without_draft(exc, passing)
        self.asked, self.catching_up = [], False

    def caught_up(self, block: bool = False) -> None:
        """A batch's catch-up under way, collected once done (or now, blocking)."""
        if self.catching_up and self.draft.busy:
            try:
                if block or self.draft.poll():
                    self.draft.finish_batch()
            except (WorkerError, WorkerLost) as exc:   # (the link forgets what the caches held)
                print(f"hetspec: a batch's draft caches could not catch up: {exc}", file=sys.stderr)
        self.catching_up = self.catching_up and self.draft.busy

    def settle(self) -> None:
        """The batch is over (a request runs alone): the draft's link is the lone request's again."""
        self.caught_up(block=True)

    def _lagging(self, parts: list[Part]) -> list[Decoder]:
        """Requests that could draft but whose cache lags, where drafting would pay once caught up."""
        decoding = [p.decoder for p in parts if p.decoder.out.length > p.decoder.out.n_prompt]
        drafting = {p.decoder.id for p in self.asked}
        could = [r for r in decoding if _drafts_for(r)]
        lagging = [r for r in could if r.id not in drafting and not self.draft.ready(r.cache, r.out.context)]
        pays = lagging and self.available() and self._window(could, [r for r in decoding if r not in could],
                                                             len(decoding) * (self.max_gamma + 1)) > 0
        return lagging if pays else []

    def observe(self, parts: list[Part], verdicts: list[Verification]) -> None:
        """The pass's time, for the cost model."""
        if self.costs is not None and verdicts:
            self.costs.observe_batch(sum(len(p.tokens) for p in parts), verdicts[0].seconds)

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
