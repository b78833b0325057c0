"""The admitted requests, and when one runs alone.

Up to [server] max_running requests are admitted at once, in order of arrival;
each keeps its own cache in the target (numbered: Running.cache), so moving
between them costs the target nothing. More than one: they step together, a
target pass for all (batch.py). One alone: it runs its own rounds, with the draft,
and once a request waits to join it, hands over after [server] turn_s (whole
rounds). The draft has one cache for the request that runs alone (a batch's are
others, batch.py): a request alone again brings it up to date first
(Decoder.draft_catches_up: the target's cache of the same model, or a prefill of
what differs).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from hetspec.scheduler.clients import Pending
from hetspec.scheduler.decoding.decoder import Decoder


@dataclass
class Running:
    """An admitted request: its decoder (its rounds, while it runs alone) and its cache in the target."""
    pending: Pending
    decoder: Decoder
    rounds: Iterator
    cache: int
    target_starts: int                  # the target's starts when it was admitted: its cache lives in that one


class Turns:
    def __init__(self, max_running: int, turn_s: float):
        self.turn_s = turn_s
        self.running: list[Running] = []
        self.free = list(range(max_running))    # the target's caches not in use
        self.last: Running | None = None        # the request that ran alone last: the draft holds its context

    def has_room(self) -> bool:
        return bool(self.free)

    def admit(self, pending: Pending, decoder_for, target_starts: int) -> Running:
        """decoder_for(cache) -> (Decoder, its rounds) of the pending request."""
        cache = self.free.pop(0)
        try:
            decoder, rounds = decoder_for(cache)
        except BaseException:
            self.free.insert(0, cache)
            raise
        running = Running(pending, decoder, rounds, cache, target_starts)
        self.running.append(running)
        return running

    def begin(self, running: Running) -> None:
        """It runs alone: the request that ran alone last is suspended, if it is another."""
        if self.last is not None and self.last is not running:
            self.last.decoder.suspend()
        self.last = running

    def batching(self) -> None:
        """A batch steps: the request that ran alone last is suspended (its draft stops)."""
        if self.last is not None:
            self.last.decoder.suspend()
            self.last = None

    def over(self, started: float, queued: bool) -> bool:
        """After a round of a request alone since `started`: hand over now? Only to a
        queued request there is room to admit."""
        return queued and self.has_room() and time.monotonic() - started >= self.turn_s

    def remove(self, running: Running) -> None:
        self.running.remove(running)
        self.free.append(running.cache)
        self.free.sort()
        if self.last is running:            # (an extension of its last window must stop)
            running.decoder.suspend()
            self.last = None
