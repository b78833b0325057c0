"""Several requests stepped together (continuous batching).

While more than one request is admitted, each step is one target pass over all of
them (VerifyBatch): every request puts in a chunk of its prompt, or its next token
after a lookup guess where it has one (part_of); requests join and
leave between steps. On a CPU a pass over a few tokens costs little more than a
pass over one, since each block of weights is unpacked once for all of them
(docs/performance.md, "Several requests in one target pass"); on a GPU the pass
costs the same up to its width.

A step holds at most [server] batch_tokens tokens: the decoding requests' first,
then prompt chunks in order of arrival, so that a new prompt is read beside the
others' steps instead of stalling them (vLLM's chunked prefill). The answer rows
of a step are shared out so that they fit the target's buffers: a request's guess
shrinks as the batch grows.

The draft drafts for a batch too (Drafts): each request in a cache of its own
in the draft worker (workers/draft/batch.py), each draft token one batched step for
all of them, before the pass (SpS: not pipelined). The cost model picks one window
for all (CostModel.batch_window): it shrinks as the batch's pass stops being free,
down to none, where every request steps target-only with its lookup guess. A
request's draft cache catches up with its context beside the target's passes (a
prompt just read, a rest just over), a chunk a step, before it drafts.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hetspec.ipc.messages import BatchWindow, DraftBatch, DraftedBatch, VerifyCommand
from hetspec.scheduler.decoding.budget import CostModel
from hetspec.scheduler.decoding.links import DraftLink, TargetLink, WorkerError, WorkerLost
from hetspec.scheduler.decoding.round import EMPTY, Verification, Window
from hetspec.scheduler.turns import Running

READY_LAG = 16       # a draft cache this many tokens behind its context catches up inside the draft's first step
MIN_CATCH_UP = 16    # tokens of context a draft cache reads at least, a step it catches up beside the pass


@dataclass
class Part:
    """One request's part of a step: tokens run after the first `keep` of its cache; its
    window is a lookup guess, or drafted (then the draft's batch took draft_s seconds)."""
    running: Running
    tokens: np.ndarray
    keep: int
    guess: Window
    drafted: bool = False
    draft_s: float = 0.0

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

    def plan(self, running: list[Running], fault: Callable[[Running, Exception], None]) -> list[Part]:
        """Each request's part of the next step, decoding requests first (a drafted window,
        or a lookup guess), then prompts in order of arrival while there is room (at least
        a token for the first). A request whose part raises is handed to fault(running,
        exc) and left out."""
        decoding = [r for r in running if r.decoder.out.length > r.decoder.out.n_prompt]
        reading = sorted((r for r in running if r.decoder.out.length == r.decoder.out.n_prompt),
                         key=lambda r: r.pending.arrived)
        room = min(self.rows, self.batch_tokens)
        drafted = self.drafts.windows(decoding, room) if self.drafts is not None else []
        share = max(1, (room - sum(len(p.tokens) for p in drafted)) // max(len(running) - len(drafted), 1))
        parts, used = list(drafted), sum(len(p.tokens) for p in drafted)
        for r in decoding + reading:
            if any(p.running is r for p in drafted):
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
        """One pass for all the parts (finish collects it); beside it, the draft caches
        that lag catch up (Drafts.catch_up), the draft's cores then not borrowed."""
        commands = [VerifyCommand(p.running.decoder.id, p.keep, len(p.tokens), p.rows,
                                  p.running.decoder.request.sampling, cache=p.running.cache) for p in parts]
        self.size = len(parts)
        catching_up = self.drafts is not None and self.drafts.catch_up([p.running for p in parts])
        self.target.start_batch(commands, [p.tokens for p in parts], borrow_cores and not catching_up)

    def finish(self, parts: list[Part]) -> list[Verification]:
        verdicts = self.target.finish_batch()
        if self.drafts is not None:
            self.drafts.observe(parts, verdicts)
        return verdicts


class Drafts:
    """The draft's part in a batch's steps: a window for each request whose speculation
    may pay, from its own draft cache, all drafted together before the pass."""

    def __init__(self, draft: DraftLink, costs: CostModel | None, max_gamma: int, available: Callable[[], bool]):
        self.draft, self.costs, self.max_gamma = draft, costs, max_gamma
        self.available = available         # the draft worker is up (not restarting)
        self.held: dict[int, int] = {}     # request id -> tokens of its context its draft cache holds
        self.catching: list[Running] = []  # requests whose caches catch up beside the pass under way
        self.gamma = 0                     # the last step's window

    def windows(self, decoding: list[Running], room: int) -> list[Part]:
        """Drafted parts for the decoding requests whose draft cache is (nearly) up to date,
        if the cost model finds a window that pays, in at most `room` tokens in all."""
        self.gamma = 0
        if not self.caught_up() or not self.available():
            return []
        ready = [r for r in decoding if r.decoder.drafts_in_batch() and self._lag(r) <= READY_LAG]
        gamma = self._window(ready, len(decoding) - len(ready), room)
        if gamma < 1:
            return []
        started = time.perf_counter()
        reply = self._send(ready, gamma, READY_LAG)
        if reply is None:
            return []
        seconds = time.perf_counter() - started
        self.gamma = gamma
        parts = []
        for r, n in zip(ready, reply.lengths):
            context = r.decoder.out.context
            window = Window(self.draft.buffers["drafts"].array[r.cache, :min(n, r.decoder.out.remaining - 1)].copy())
            if len(window):
                parts.append(Part(r, np.concatenate([context[-1:], window.tokens]), len(context) - 1, window,
                                  drafted=True, draft_s=seconds))
        return parts

    def catch_up(self, stepping: list[Running]) -> bool:
        """Start the draft caches of the requests that could draft but lag reading their
        context, together as much as the draft reads in about one pass, beside the pass;
        not where no window would pay even with every cache ready. It runs on in the
        background (caught_up). Whether the draft is busy now."""
        if not self.caught_up(block=False) or not self.available():
            return self.draft.busy
        decoding = [r for r in stepping if r.decoder.out.length > r.decoder.out.n_prompt]
        could = [r for r in decoding if r.decoder.drafts_in_batch()]
        lagging = [r for r in could if self._lag(r) > READY_LAG]
        if not lagging or self._window(could, len(decoding) - len(could), len(decoding) * (self.max_gamma + 1)) < 1:
            return False
        tokens = MIN_CATCH_UP * len(lagging)
        if self.costs is not None:
            tokens = int(self.costs.batch_scale * self.costs.measured(len(decoding)) / self.costs.prefill_s)
        if self._start(lagging, 0, max(MIN_CATCH_UP, tokens // len(lagging))):
            self.catching = lagging
        return bool(self.catching)

    def caught_up(self, block: bool = False) -> bool:
        """Whether the draft is free: a catch-up under way is collected once done (or now,
        blocking); one whose reply was dropped (a request's end drains both links) is over."""
        if self.catching and self.draft.busy:
            try:
                done = block or self.draft.poll()
            except WorkerLost:             # (poll: the link forgets the command)
                self.held.clear()
                done = False
            if done:
                self._finish(self.catching)
        if not self.draft.busy:
            self.catching = []
        return not self.draft.busy

    def settle(self) -> None:
        """The batch is over (a request runs alone): the draft's link is the lone request's again."""
        self.caught_up(block=True)


    def observe(self, parts: list[Part], verdicts: list[Verification]) -> None:
        """The step's timings, for the cost model; the caches of requests no longer stepping are forgotten."""
        if self.costs is not None and verdicts:
            drafted = [p for p in parts if p.drafted]
            self.costs.observe_batch(sum(len(p.tokens) for p in parts), verdicts[0].seconds, len(drafted),
                                     self.gamma if drafted else 0, drafted[0].draft_s if drafted else 0.0)
        ids = {p.running.decoder.id for p in parts}
        self.held = {i: n for i, n in self.held.items() if i in ids}

    def _window(self, ready: list[Running], others: int, room: int) -> int:
        """One window for the ready requests: the cost model's (forced to 1 or more where
        every one of them is), without one the smallest of their configured gammas;
        never more than fits in `room` tokens beside the others' next tokens."""
        if not ready:
            return 0
        top = min(self.max_gamma, (room - others) // len(ready) - 1)
        if self.costs is None:
            return min(min(r.decoder.request.gamma for r in ready), top)
        forced = all(r.decoder.gate.forced for r in ready)
        return self.costs.batch_window([r.decoder.stats.acceptance for r in ready], others, top, forced)

    def _lag(self, r: Running) -> int:
        return len(r.decoder.out.context) - self.held.get(r.decoder.id, 0)

    def _send(self, requests: list[Running], gamma: int, catch_up: int) -> DraftedBatch | None:
        return self._finish(requests) if self._start(requests, gamma, catch_up) else None

    def _start(self, requests: list[Running], gamma: int, catch_up: int) -> bool:
        """Send the draft its DraftBatch; False if it is gone (the step goes on without it)."""
        contexts = self.draft.buffers["contexts"].array
        windows = []
        for r in requests:
            context = r.decoder.out.context
            contexts[r.cache, :len(context)] = context
            windows.append(BatchWindow(r.decoder.id, r.cache, len(context), r.decoder.request.sampling))
        try:
            self.draft.send(DraftBatch(windows, gamma, catch_up))
        except WorkerLost:                 # the supervisor restarts it; its caches are gone
            self.held.clear()
            return False
        return True

    def _finish(self, requests: list[Running]) -> DraftedBatch | None:
        """The draft's reply; None where it failed or died: the requests step target-only
        (a draft's fault never costs a request its tokens)."""
        try:
            reply = self.draft.wait()
        except (WorkerError, WorkerLost) as exc:
            print(f"hetspec: a batch's draft failed, its requests step target-only: {exc}", file=sys.stderr)
            self.held.clear()
            return None
        assert isinstance(reply, DraftedBatch), reply
        for r, n in zip(requests, reply.cached):
            self.held[r.decoder.id] = n
        return reply


def part_of(running: Running, room: int) -> Part:
    """What a request puts in the next step, at most `room` tokens: the next chunk of its
    prompt (each chunk answers for its last token: the last chunk's answer is the first
    token), or its last token after the cached ones and a lookup guess."""
    decoder = running.decoder
    context = decoder.out.context
    if decoder.out.length == decoder.out.n_prompt:
        return Part(running, context[decoder.read:decoder.read + room], decoder.read, EMPTY)
    guess = decoder.guess(room - 1)
    return Part(running, np.concatenate([context[-1:], guess.tokens]), len(context) - 1, guess)


def commit(part: Part, verdict: Verification) -> None:
    """The step's verdict on a request's part: its tokens, or how far its prompt is read."""
    decoder = part.running.decoder
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
