"""What the decoder is given: a request resolved once (scheduler/resolve.py), and the engine's fixed capabilities."""
from __future__ import annotations

from dataclasses import dataclass

from hetspec.core.branches import Dynamic
from hetspec.core.params import SamplingParams, Speculation
from hetspec.core.sampling import Rule, Sampling
from hetspec.scheduler.decoding.acceptance_prior import GENERIC


@dataclass(frozen=True)
class Request:
    """One request: its parameters (seed filled in) and the engine's choices for it."""
    id: int
    params: SamplingParams
    sampling: Sampling         # what the workers draw with, and the acceptance rule
    gamma: int                 # the draft budget: the engine's, or the request's own
    sequences: int | Dynamic   # draft branches: a number or DYNAMIC
    rebalance: bool            # gamma "auto": each round's length comes from the costs (budget.Windows)
    prior: float = GENERIC     # where the acceptance estimate starts (the engine's past requests)
    speculation: Speculation = Speculation.AUTO   # always: never rest from speculating (gate.py)

    @property
    def rule(self) -> Rule:
        return self.sampling.rule


@dataclass(frozen=True)
class Capabilities:
    """What this engine can do, fixed at start-up."""
    max_gamma: int             # the shared buffers' rows: no window is longer
    max_sequences: int
    borrow_cores: bool         # the target prefills a long prompt on the draft's cores too
    alone_borrows_cores: bool  # the target decoding alone (the draft idle) runs on the draft's cores too
    draft_borrows_cores: bool  # the draft prefills a long prompt on the target's cores too, the target waiting
    keep_drafting: bool        # the draft grows the next window until the target's verdict is in
    kv_handover: bool          # the draft takes the target's cache of a long prompt instead of prefilling it
    lookup: int = 0            # tokens a target-only round of a speculative mode may guess (lookup.py); 0: none
    batch_borrows_cores: bool = False   # a pass of several requests (scheduler/batch.py) runs on the draft's cores too
    batch_drafts: bool = False          # the draft drafts for requests stepped together (scheduler/batch.py)
