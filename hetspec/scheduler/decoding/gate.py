"""Whether speculation pays, learnt online: a draft that guesses badly must not make the engine slower than the
target alone.

A request's speculative rounds are judged against the target alone's time per token. Where speculating commits more
slowly over the stint (its rounds since it began speculating, from the 2 * RECENT-th), or its last RECENT rounds do
beyond one standard error of their mean gain (a round commits 1 token or a window's worth, so a few bad rounds in a
row are chance, not a verdict; many are the text changing), or they commit no more than a token a round (what a
target pass does), the request rests: it decodes target-only for a while, then probes with RECENT speculative rounds. A failed probe
doubles the rest (up to MAX_REST) and makes it long enough that the probe's cost (the draft catching up, its slower
rounds) is at most PROBE_SHARE of the rest's time; one that pays resets it. The rest carries over to the engine's next
request of the same mode (Memory), so a hopeless draft keeps the engine on the target, probing now and then; each mode
has its own, as SpS and DuoDecoding cost differently. Judging by the clock is safe: greedy tokens and keyed draws
(seeded requests) are the same in either kind of round, and an unseeded request's tokens are random anyway.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass

from hetspec.core.params import Mode

MIN_ROUNDS = 3       # speculative rounds that time the target alone first where it is not timed yet
RECENT = 8           # rounds judged at once, a probe's first among them: a request's text may change character midway
FIRST_REST = 8       # target-only tokens after the first verdict against speculation: it may be a bad patch
MAX_REST = 256
PROBE_SHARE = 0.05   # a failed probe costs at most this share of the rest after it...
MAX_PROBE_REST = 1024  # ...unless that rest would be longer than this (tokens)
SMOOTHING = 0.2


@dataclass
class Memory:
    """What the engine's earlier requests of one mode learnt."""
    target_s: float | None     # seconds per token of the target alone, lookup guesses included (None: not yet)
    rest: int = 0              # target-only tokens the next request starts with
    rest_len: int = FIRST_REST  # the next rest, should a probe fail


def memories(target_s: float | None) -> dict[str, Memory]:
    """An engine's memories, one per speculative mode."""
    return {mode: Memory(target_s) for mode in Mode if mode.drafts}


class Gate:
    """One request's gate. rest and rest_len start from the engine's Memory and are written back as they change;
    they are the request's own, as requests of one mode taking turns (slots.py) share that Memory."""

    def __init__(self, memory: Memory, forced: bool, clock=time.perf_counter):
        self.memory, self.forced, self.clock = memory, forced, clock
        self.rest = 0 if forced else memory.rest    # target-only tokens still to go (0: speculate)
        self.rest_len = memory.rest_len
        self.recent: deque = deque(maxlen=RECENT)   # (seconds, committed) of this stint's last rounds
        self.stint = (0.0, 0, 0)                    # its judged rounds' seconds, tokens and number
        self.fresh = True                           # the stint's first round is yet to come
        self.probe_began: float | None = None      # when the probe under way began (None: none is)
        self.probe_tokens = 0                       # tokens it has committed since

    def start(self) -> None:
        """The prompt is in: a request that begins by speculating begins a timed probe, so a failed one rests as long
        as it cost (else every request of an engine whose draft cannot pay would probe at its start)."""
        if self.speculate and not self.forced:
            self.probe_began, self.probe_tokens = self.clock(), 0

    @property
    def speculate(self) -> bool:
        return self.rest <= 0

    def rested(self, seconds: float, committed: int) -> None:
        """A target-only step by the gate's choice (several tokens where a lookup guess held); probe after the rest."""
        self.rest = max(self.rest - committed, 0)
        self.fresh = self.rest <= 0
        self.observe_target(seconds / committed)
        self.memory.rest = self.rest
        if self.fresh:
            self.probe_began, self.probe_tokens = self.clock(), 0

    def probing(self, committed: int) -> None:
        """Tokens committed during a probe: by its rounds (judge), and by the target alone while the draft caught up."""
        if self.probe_began is not None:
            self.probe_tokens += committed

    def observe_target(self, seconds: float) -> None:
        known = self.memory.target_s
        self.memory.target_s = seconds if known is None else known + SMOOTHING * (seconds - known)

    def judge(self, seconds: float, committed: int) -> None:
        """After a speculative round: it committed `committed` tokens in `seconds`."""
        fresh, self.fresh = self.fresh, False
        self.probing(committed)
        if self.forced or fresh:               # it also brought the draft up to date: its time is no guide
            return
        self.recent.append((seconds, committed))
        self.stint = (self.stint[0] + seconds, self.stint[1] + committed, self.stint[2] + 1)
        if len(self.recent) < (MIN_ROUNDS if self.memory.target_s is None else RECENT):
            return
        if self.memory.target_s is None:       # nothing to compare with: time the target alone
            self.rest = MIN_ROUNDS
            self._end_stint()
        elif self._loses():
            self.rest, self.rest_len = max(self.rest_len, self._paid_back()), min(2 * self.rest_len, MAX_REST)
            self._end_stint()
        else:
            self.rest_len = FIRST_REST
        self.probe_began = None
        self.memory.rest, self.memory.rest_len = self.rest, self.rest_len

    def _end_stint(self) -> None:
        """The request rests: the rounds after it are another stint's."""
        self.recent.clear()
        self.stint = (0.0, 0, 0)

    def _paid_back(self) -> int:
        """Target-only tokens over which a failed probe's cost, beyond the target alone's time for its tokens, is
        PROBE_SHARE of the time."""
        if self.probe_began is None:
            return 0
        lost = self.clock() - self.probe_began - self.probe_tokens * self.memory.target_s
        return min(MAX_PROBE_REST, max(0, math.ceil(lost / (PROBE_SHARE * self.memory.target_s))))

    def _loses(self) -> bool:
        """No more than a token a round lately (a one-token round costs a target pass, as the target alone does, so it
        only seems to pay against a target_s timed slow, never retimed meanwhile), slower than the target alone over
        the stint (once it has run 2 * RECENT rounds: its mean is noisy before), or lately beyond one standard error
        of the rounds' mean gain."""
        seconds, tokens, rounds = self.stint
        if sum(c for _, c in self.recent) <= len(self.recent) or \
                (rounds >= 2 * RECENT and seconds > tokens * self.memory.target_s):
            return True
        gains = [c * self.memory.target_s - s for s, c in self.recent]   # seconds each round saved
        return statistics.fmean(gains) + statistics.stdev(gains) / math.sqrt(len(gains)) < 0
