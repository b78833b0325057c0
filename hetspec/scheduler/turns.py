"""Requests take turns, so that a long request never makes a short one wait for
all of its tokens.

Up to [server] max_running requests are admitted at once; each keeps its own
cache in the target (numbered: Running.cache), so switching between them costs the target
nothing. The draft has one cache: a request whose turn comes round after
another's brings it up to date first (Decoder.draft_catches_up: the target's
cache of the same model, or a prefill of what differs). A turn is whole rounds, and lasts at least
[server] turn_s once another request waits; the next turn goes to the admitted
request that has waited longest since its last one (a new one: since it arrived).
Alone, a request never yields.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from hetspec.scheduler.clients import Pending
from hetspec.scheduler.decoding.decoder import Decoder


@dataclass
class Running:
    """An admitted request: its decoder, stepped a round at a time, and its cache in the target."""
    pending: Pending
    decoder: Decoder
    rounds: Iterator
    cache: int
    target_starts: int                  # the target's starts when it was admitted: its cache lives in that one
    waiting_since: float = field(default_factory=time.monotonic)


class Turns:
    def __init__(self, max_running: int, turn_s: float):
        self.turn_s = turn_s
        self.running: list[Running] = []
        self.free = list(range(max_running))    # the target's caches not in use
        self.last: Running | None = None        # whose turn was last: the draft holds its context

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
        running = Running(pending, decoder, rounds, cache, target_starts, pending.arrived)
        self.running.append(running)
        return running

    def next(self) -> Running | None:
        """Whose turn it is: the one that has waited longest."""
        return min(self.running, key=lambda r: r.waiting_since, default=None)

    def begin(self, running: Running) -> None:
        """Its turn starts: the request whose turn was last is suspended, if it is another."""
        if self.last is not None and self.last is not running:
            self.last.decoder.suspend()
        self.last = running

    def over(self, started: float, queued: bool) -> bool:
        """After a round of a turn that started at `started`: hand over now? Only to
        another admitted request, or to a queued one there is room to admit."""
        others = len(self.running) > 1 or (queued and self.has_room())
        return others and time.monotonic() - started >= self.turn_s

    def end(self, running: Running) -> None:
        running.waiting_since = time.monotonic()

    def remove(self, running: Running) -> None:
        self.running.remove(running)
        self.free.append(running.cache)
        self.free.sort()
        if self.last is running:            # (an extension of its last window must stop)
            running.decoder.suspend()
            self.last = None
