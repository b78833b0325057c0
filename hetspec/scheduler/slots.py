"""The admitted requests (up to [server] max_running, each in its own cache of the target),
and which one runs alone. A request that waits joins a lone one once that has run alone
for [server] turn_s and a round."""
from __future__ import annotations

import time
from collections.abc import Callable

from hetspec.scheduler.decoding.decoder import Decoder


class Slots:
    def __init__(self, max_running: int, turn_s: float):
        self.turn_s = turn_s
        self.running: list[Decoder] = []         # the admitted requests, in order of arrival
        self.free = list(range(max_running))     # the target's caches not in use
        self.last: Decoder | None = None         # the request that ran alone last
        self.alone_since = (0.0, 0)              # ... since when, alone this time, and its rounds alone then

    def may_admit(self) -> bool:
        """Room for one more, unless a lone request's turn (turn_s, and a round) is not over."""
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
        """A batch steps, or another request runs alone: the last lone one is suspended."""
        if self.last is not None:
            self.last.suspend()
            self.last = None

    def remove(self, decoder: Decoder) -> None:
        self.running.remove(decoder)
        self.free.append(decoder.cache)
        self.free.sort()
        if self.last is decoder:
            self.batching()
