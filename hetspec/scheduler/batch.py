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

The draft drafts for no request of a batch: it has one cache, and a window for
each of B requests would cost B draft windows a step, serially, against a verify
that is no longer free. A request that is alone again runs its own rounds, and the
draft catches up with it (turns.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hetspec.ipc.messages import VerifyCommand
from hetspec.scheduler.decoding.links import TargetLink
from hetspec.scheduler.decoding.round import EMPTY, Verification, Window
from hetspec.scheduler.turns import Running


@dataclass
class Part:
    """One request's part of a step: tokens run after the first `keep` of its cache."""
    running: Running
    tokens: np.ndarray
    keep: int
    guess: Window

    @property
    def rows(self) -> int:
        return len(self.guess) + 1


class Batch:
    def __init__(self, target: TargetLink, batch_tokens: int, rows: int):
        self.target = target
        self.batch_tokens = batch_tokens   # tokens a step holds: [server] batch_tokens
        self.rows = rows                   # answer rows a step holds: the target's buffers
        self.size = 0                      # requests in the last step

    def plan(self, running: list[Running], fault: Callable[[Running, Exception], None]) -> list[Part]:
        """Each request's part of the next step, decoding requests first, then prompts
        in order of arrival while there is room (at least a token for the first). A
        request whose part raises is handed to fault(running, exc) and left out."""
        decoding = [r for r in running if r.decoder.out.length > r.decoder.out.n_prompt]
        reading = sorted((r for r in running if r.decoder.out.length == r.decoder.out.n_prompt),
                         key=lambda r: r.pending.arrived)
        share = max(1, min(self.rows, self.batch_tokens) // max(len(running), 1))
        parts, used = [], 0
        for r in decoding + reading:
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
        """One pass for all the parts (finish collects it)."""
        commands = [VerifyCommand(p.running.decoder.id, p.keep, len(p.tokens), p.rows,
                                  p.running.decoder.request.sampling, cache=p.running.cache) for p in parts]
        self.size = len(parts)
        self.target.start_batch(commands, [p.tokens for p in parts], borrow_cores)

    def finish(self) -> list[Verification]:
        return self.target.finish_batch()


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
    if decoder.out.length > decoder.out.n_prompt:
        decoder.commit_target_step(part.guess, verdict)
        decoder.stats.batched_rounds += 1
    elif decoder.read + len(part.tokens) < len(decoder.out.context):
        decoder.read += len(part.tokens)       # a chunk of the prompt: its answer is not needed
    else:
        decoder.first_token(verdict)
