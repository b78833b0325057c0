"""A step of the scheduler's loop (Scheduler._run): one target pass for every running
request, whatever their number.

  plan     each request's part in the step: a request alone takes its own round
           (Alone: decoding/decoder.py states each kind once), several take a
           batch's parts (Together: batch.py)
  start    the target's pass sent, the draft drafting beside it
  finish   the verdicts collected
  commit   each request's tokens, each with its own fault boundary

Between start and finish the loop streams each request's tokens of the last step and
reads its clients; between steps it admits, cancels and times out requests.
"""
from __future__ import annotations

from hetspec.scheduler.batch import Batch, Part, commit
from hetspec.scheduler.decoding.decoder import Decoder
from hetspec.scheduler.decoding.round import Verification


class Alone:
    """A lone request's step: its decoder's next part, which commits its own tokens."""

    def __init__(self, decoder: Decoder):
        self.running = [decoder]

    def start(self, borrow_cores: bool) -> None:     # (a lone part decides its own cores)
        self.running[0].start()

    def finish(self) -> list[None]:
        self.running[0].finish()
        return [None]

    def commit(self, i: int, verdict: None) -> None:
        """Done in finish: a round's commit is part of its kind (decoder.py)."""


class Together:
    """Several requests' parts in one pass (VerifyBatch), the draft drafting for them beside it."""

    def __init__(self, batch: Batch, parts: list[Part]):
        self.batch, self.parts = batch, parts
        self.running = [p.decoder for p in parts]

    def start(self, borrow_cores: bool) -> None:
        self.batch.start(self.parts, borrow_cores)

    def finish(self) -> list[Verification]:
        return self.batch.finish(self.parts)

    def commit(self, i: int, verdict: Verification) -> None:
        commit(self.parts[i], verdict)
