"""The admitted requests, and when one runs alone.

Up to [server] max_running requests are admitted at once, in order of arrival;
each keeps its own cache in the target (numbered: Running.cache), so moving
between them costs the target nothing. More than one: each step is a batch's
(step.Together). One alone: each step is its own round (step.Alone), and a
request that waits joins it once it has run alone for [server] turn_s (whole
rounds). The draft has one cache for the request that runs alone (a batch's are
others, batch.py): a request alone again brings it up to date first
(Decoder.draft_catches_up: the target's cache of the same model, or a prefill of
what differs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from hetspec.scheduler.clients import Pending
from hetspec.scheduler.decoding.decoder import Decoder


@dataclass
class Running:
    """An admitted request: its decoder and its cache in the target."""
    pending: Pending
    decoder: Decoder
    cache: int
    target_starts: int                  # the target's starts when it was admitted: its cache lives in that one


class Turns:
    def __init__(self, max_running: int, turn_s: float):
        self.turn_s = turn_s
        self.running: list[Running] = []
        self.free = list(range(max_running))    # the target's caches not in use
        self.last: Running | None = None        # the request that ran alone last: the draft holds its context
        self.alone_since = (0.0, 0)             # ... since when, alone this time, and its rounds alone then

    def may_admit(self) -> bool:
        """Room for one more, unless a request runs alone and its turn is not over: turn_s,
        and a round at least (Decoder.rounds_alone: not only its prompt or the draft catching up)."""
        if not self.free or len(self.running) != 1 or self.last is not self.running[0]:
            return bool(self.free)
        since, rounds = self.alone_since
        return time.monotonic() - since >= self.turn_s and self.last.decoder.rounds_alone > rounds

    def admit(self, pending: Pending, decoder_for, target_starts: int) -> Running:
        """decoder_for(cache) -> the pending request's Decoder."""
        cache = self.free.pop(0)
        try:
            decoder = decoder_for(cache)
        except BaseException:
            self.free.insert(0, cache)
            raise
        running = Running(pending, decoder, cache, target_starts)
        self.running.append(running)
        return running

    def begin(self, running: Running) -> None:
        """It runs alone: the request that ran alone last is suspended, if it is another."""
        if self.last is not running:
            if self.last is not None:
                self.last.decoder.suspend()
            self.last, self.alone_since = running, (time.monotonic(), running.decoder.rounds_alone)

    def batching(self) -> None:
        """A batch steps: the request that ran alone last is suspended (its draft stops)."""
        if self.last is not None:
            self.last.decoder.suspend()
            self.last = None

    def remove(self, running: Running) -> None:
        self.running.remove(running)
        self.free.append(running.cache)
        self.free.sort()
        if self.last is running:            # (an extension of its last window must stop)
            running.decoder.suspend()
            self.last = None
