"""The admitted requests: their caches in the target, and when one runs alone.

Up to [server] max_running requests are admitted at once, in order of arrival; each
keeps its own cache in the target (Decoder.cache), so moving between them costs the
target nothing. More than one: each step is a batch's (batch.py). One alone: each
step is its own part (Decoder.own_part), and a request that waits joins it once it
has run alone for [server] turn_s (whole rounds). The draft has one cache for the
request that runs alone (a batch's are others, batch.py): a request alone again
brings it up to date first (Decoder.draft_catches_up).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from hetspec.scheduler.decoding.decoder import Decoder


class Slots:
    def __init__(self, max_running: int, turn_s: float):
        self.turn_s = turn_s
        self.running: list[Decoder] = []         # the admitted requests, in order of arrival
        self.free = list(range(max_running))     # the target's caches not in use
        self.last: Decoder | None = None         # the request that ran alone last: the draft's cache is its
        self.alone_since = (0.0, 0)              # ... since when, alone this time, and its rounds alone then

    def may_admit(self) -> bool:
        """Room for one more, unless a request runs alone and its turn is not over: turn_s,
        and a round at least (Decoder.rounds_alone: not only its prompt or the draft catching up)."""
        if not self.free or len(self.running) != 1 or self.last is not self.running[0]:
            return bool(self.free)
        since, rounds = self.alone_since
        return time.monotonic() - since >= self.turn_s and self.last.rounds_alone > rounds

    def admit(self, decoder_for: Callable[[int], Decoder]) -> Decoder:
        """decoder_for(cache) -> the admitted request's Decoder, in that cache of the target."""
        cache = self.free.pop(0)
        try:
            decoder = decoder_for(cache)
        except BaseException:
            self.free.insert(0, cache)
            raise
        self.running.append(decoder)
        return decoder

    def begin(self, decoder: Decoder) -> None:
        """It runs alone: the request that ran alone last is suspended, if it is another."""
        if self.last is not decoder:
            self.batching()
            self.last, self.alone_since = decoder, (time.monotonic(), decoder.rounds_alone)

    def batching(self) -> None:
        """A batch steps (or another request runs alone): the request that ran alone last is
        suspended, its draft stopped (an extension of its last window must stop)."""
        if self.last is not None:
            self.last.suspend()
            self.last = None

    def remove(self, decoder: Decoder) -> None:
        self.running.remove(decoder)
        self.free.append(decoder.cache)
        self.free.sort()
        if self.last is decoder:
            self.batching()
