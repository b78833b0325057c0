"""A request's counters as the decoding loop keeps them, and as the client sees them."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from hetspec.core.sampling import Rule
from hetspec.scheduler.decoding.acceptance_prior import GENERIC

PRIOR_WEIGHT = 5         # tokens' worth of belief in the acceptance prior


@dataclass
class Stats:
    start: float = field(default_factory=time.perf_counter)
    ttft_s: float = 0.0
    rounds: int = 0             # verify passes after the prefill
    spec_rounds: int = 0        # ... of which verified a draft window
    target_only_rounds: int = 0  # ... decoded by the target alone (target mode, or while the draft prefilled)
    ran_ahead: int = 0          # ... of which the target had decoded ahead, unasked (Decoder.ahead)
    batched_rounds: int = 0     # ... of which were steps of a batch, beside other requests (scheduler/batch.py)
    rested: int = 0             # tokens committed in target-only rounds because speculating did not pay (gate.py)
    probes: int = 0             # times speculation was tried again after such a rest
    drafts: int = 0             # draft windows verified (vLLM's num_drafts)
    drafted: int = 0            # draft tokens verified
    accepted: int = 0           # ... and accepted
    rejections: int = 0         # windows cut short by a rejected token
    committed_in_spec_rounds: int = 0
    branch_hits: int = 0        # pipelined windows whose branch the target's token picked
    lookup_guessed: int = 0     # lookup guess tokens verified in target-only rounds (lookup.py)
    lookup_accepted: int = 0    # ... and accepted
    round_lookup_guessed: int = 0   # lookup guess tokens verified after a speculative round's window (both proposers)
    round_lookup_accepted: int = 0  # ... and accepted
    shadow_rounds: int = 0      # a batch's drafted or bare steps, beside which a lookup guess was judged unverified
    shadow_accepted: int = 0    # ... and the guessed tokens the target's own would have kept (batch.shadow_step)
    draft_s: float = 0.0
    verify_s: float = 0.0
    round_s: float = 0.0        # wall time of speculative rounds
    busy_s: float = 0.0         # ... of which a worker computed: the longer side, or both in sequence
    sequences_hist: Counter = field(default_factory=Counter)
    accepted_per_pos: list = field(default_factory=list)  # [i]: windows whose token i was accepted
    draft_prompt_kv: str = "own"  # how the draft got the prompt's cache: its own prefill, or the "target"'s
    prior: float = GENERIC
    fallback: str | None = None  # why the target goes on without the draft: it died, is restarting, or its prefill
                                 # would not pay (None: it has not; Decoder.mode follows)

    @property
    def acceptance(self) -> float:
        """Per-token acceptance so far (accepted / tokens decided), from the prior."""
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.accepted + self.rejections + PRIOR_WEIGHT)

    @property
    def target_step_yield(self) -> float:
        """Tokens a target-only step commits so far with its lookup guess, unverified ones' included (from one)."""
        return 1 + (self.lookup_accepted + self.shadow_accepted) / (self.target_only_rounds + self.shadow_rounds + 1)

    def target_round(self) -> None:
        self.rounds += 1
        self.target_only_rounds += 1

    def guess_judged(self, guessed: int, kept: int, in_round: bool) -> None:
        """A lookup guess verified, `kept` of its tokens committed: in a target-only step, or after a round's window."""
        if in_round:
            self.round_lookup_guessed += guessed
            self.round_lookup_accepted += kept
        else:
            self.lookup_guessed += guessed
            self.lookup_accepted += kept

    def spec_round(self, wall: float, draft_s: float, verify_s: float, drafted: int, accepted: int,
                   committed: int, parallel: bool, serial_draft_s: float = 0.0) -> None:
        """serial_draft_s: drafting the target waited for before the round (SpS-style)."""
        self.rounds += 1
        self.busy_s += serial_draft_s + (max(draft_s, verify_s) if parallel else draft_s + verify_s)
        self.spec_rounds += 1
        self.round_s += wall
        self.draft_s += serial_draft_s + draft_s
        self.verify_s += verify_s
        self.drafted += drafted
        self.accepted += accepted
        self.drafts += drafted > 0
        self.accepted_per_pos.extend([0] * (accepted - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1
        self.rejections += accepted < drafted
        self.committed_in_spec_rounds += committed

    def report(self, request, out) -> dict:
        """The stats dict a client receives with its result."""
        total = time.perf_counter() - self.start
        new, spec = len(out.new_ids), self.spec_rounds
        return {
            "mode": request.params.mode, "prompt_tokens": out.n_prompt, "new_tokens": new,
            "finish_reason": out.finish_reason, "ttft_s": self.ttft_s, "total_s": total,
            "tokens_per_s": new / total if total > 0 else 0.0,
            "gamma": request.gamma if request.params.mode.drafts else 0,
            "sequences": request.sequences, "rule": request.rule,
            "seed": request.params.seed if request.rule is Rule.KEYED else None,   # it gives these tokens again
            "rounds": self.rounds, "spec_rounds": spec, "target_only_rounds": self.target_only_rounds,
            "ran_ahead": self.ran_ahead, "batched_rounds": self.batched_rounds,
            "rested": self.rested, "probes": self.probes,
            "drafts": self.drafts, "drafted": self.drafted, "accepted": self.accepted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_per_round": self.committed_in_spec_rounds / spec if spec else 0.0,
            "branch_hits": self.branch_hits, "draft_prompt_kv": self.draft_prompt_kv,
            "lookup_guessed": self.lookup_guessed, "lookup_accepted": self.lookup_accepted,
            "round_lookup_guessed": self.round_lookup_guessed, "round_lookup_accepted": self.round_lookup_accepted,
            "sequences_hist": {str(k): v for k, v in sorted(self.sequences_hist.items())},
            "draft_s": self.draft_s, "verify_s": self.verify_s, "round_s": self.round_s,
            "overhead_s": max(0.0, self.round_s - self.busy_s), "fallback": self.fallback,
        }
