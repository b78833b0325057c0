"""What a step passes between draft, target and acceptance rule (kinds of part: decoder.py; steps: scheduler/batch.py).

  part          one request's part in a step: the tokens the target runs for it, and what commits its verdict
  window        draft tokens waiting for the target's verdict (Window); EMPTY: none
  draft         what the draft returned (Draft); NO_DRAFT: nothing was drafted
  branch        one drafted sequence; a pipelined draft proposes several, each starting with another candidate
                for the target's next token, which picks one
  proposer      what guessed a window's tokens: the draft, then prompt lookup after them (a lookup guess,
                free where a pass of a few more tokens costs no more)
  verification  the target's choice at each window position and after it (Verification)
  accepted      the window's first tokens, as many as the acceptance rule keeps
  bonus token   the target's token after the accepted ones: its correction at the first rejection, or one more

A round commits the accepted tokens and the bonus token, fewer only where a stop condition comes first.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from hetspec.core.branches import pick_branch
from hetspec.ipc.messages import BranchPlan


@dataclass
class Window:
    """Draft tokens waiting for the verdict, and the draft's distribution at each where accept_sampled needs it."""
    tokens: np.ndarray
    probs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, n: int) -> Window:
        return Window(self.tokens[:max(n, 0)], None if self.probs is None else self.probs[:max(n, 0)])

    def then(self, guess: np.ndarray) -> Window:
        """This window and a lookup guess after it: rows past its probs are certain (accept_sampled)."""
        return Window(np.concatenate([self.tokens, guess]), self.probs) if len(guess) else self


EMPTY = Window(np.zeros(0, dtype=np.int32))


@dataclass
class Verification:
    choice: np.ndarray            # the target's token at each requested position: argmax or keyed draw
    probs: np.ndarray | None      # its distribution there, sampling unkeyed (a shared-memory view)
    seconds: float


@dataclass
class Draft:
    """What the draft returned: branches in slot order (the likeliest last)."""
    branches: list[np.ndarray]
    probs: list[np.ndarray] | None   # per branch: (len, vocab) shared-memory views, sampling unkeyed
    seconds: float

    def window(self, i: int, skip: int = 0) -> Window:
        return Window(self.branches[i][skip:], None if self.probs is None else self.probs[i][skip:])

    def after(self, committed: np.ndarray) -> Window | None:
        """The rest of the branch that starts with the tokens committed after the context it was drafted from: the
        target's bonus token (which picks the branch), after the lookup guess's tokens it kept. None if none does."""
        i = pick_branch(self.branches, int(committed[0]))
        if i is None or len(self.branches[i]) < len(committed):
            return None
        n = len(committed)
        return self.window(i, skip=n) if np.array_equal(self.branches[i][:n], committed) else None


NO_DRAFT = Draft([], None, 0.0)


class NextWindow(NamedTuple):
    """What the draft drafts for a request beside a step's pass: gamma tokens after context (its context and the
    window the pass verifies), alone as branches (BranchPlan)."""
    context: np.ndarray
    gamma: int
    plan: BranchPlan | None = None


@dataclass
class Part:
    """One request's part in a step: `tokens` run after the first `keep` of its cache in the step's pass (None: no
    pass, the target ran ahead), whose verdict on its last `rows` positions `finish` commits. A lone request's part
    may borrow the draft's cores and have the target run ahead; a batch's borrow as the batch does (borrow None).
    next_window: what the draft drafts for it beside the pass, returned in `drafted` before finish (batch.Drafts).
    shadow: a drafting request's lookup guess in a batch, never verified (batch.shadow_step)."""
    decoder: Any                   # its decoding.decoder.Decoder
    tokens: np.ndarray | None
    keep: int
    guess: Window                  # the tokens verified after the last committed one: a window or a lookup guess
    finish: Callable[[Verification | None], Any]
    borrow: bool | None = None
    ahead: int = 0
    next_window: NextWindow | None = None
    drafted: Draft = field(default_factory=lambda: NO_DRAFT)
    shadow: Window | None = None

    @property
    def rows(self) -> int:
        return len(self.guess) + 1
