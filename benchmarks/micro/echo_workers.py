"""A draft and a target worker that compute nothing, to time the scheduler and IPC alone: the real
worker loop (workers/common/process.serve) answering the real commands through the real shared
buffers, each answer a rule's instead of a model's. Both follow one next-token rule (echo_next),
the draft missing at every position p % miss_every == miss_every - 1, so that windows end as real
ones do; greedy output is echo_sequence(prompt). Under the unkeyed rule both write one-hot rows,
so speculative sampling accepts what greedy does. Replies report the handler's own seconds (the
engine's overhead_s is then the scheduler's), or with seconds="modelled" what EchoSpec's costs say
(its cost model then keeps windows of a real pair's length).

    python -m hetspec.benchmarks.micro.echo_workers {draft,target} --endpoint ENDPOINT --spec JSON
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from hetspec.core.branches import allocate_budget, split_budget, to_slot
from hetspec.core.pinning import pin
from hetspec.core.sampling import Rule
from hetspec.ipc import messages as msg
from hetspec.workers.common.process import parse_args, serve

FIRST = 256                     # the rule's tokens are >= FIRST: a tokenizer's special tokens (EOS) never come out
DYNAMIC_FIRST = (0.7, 0.2, 0.1)  # the echo draft's belief in its first-token candidates, for dynamic branches


def echo_next(token, vocab: int):
    """The token after `token` (an int or an array of them)."""
    return FIRST + (np.asarray(token, np.int64) * 31 + 7) % (vocab - FIRST)


def echo_sequence(prompt: list[int], n: int, vocab: int) -> list[int]:
    """The n tokens both workers agree come after the prompt: the target's greedy output."""
    tokens, last = [], prompt[-1]
    for _ in range(n):
        last = int(echo_next(last, vocab))
        tokens.append(last)
    return tokens


@dataclass
class EchoSpec:
    vocab: int = 49152
    miss_every: int = 0          # the draft misses the token at every position p % miss_every == miss_every - 1
    cores: list[int] = field(default_factory=list)   # pinned there, as the real workers are (none: not pinned)
    draft_s: float = 0.005       # calibration's answers: a draft token, ...
    verify_s: float = 0.02       # ... a verify pass of one token, ...
    verify_token_s: float = 0.001   # ... and each token more
    seconds: str = "real"        # what replies report: "real" (the handler's time) or "modelled" (the costs above)

    def took(self, start: float, modelled: float) -> float:
        """The seconds a reply reports for work begun at `start` that the model says takes `modelled`."""
        return modelled if self.seconds == "modelled" else time.perf_counter() - start

    def verify_cost(self, n_tokens: int) -> float:
        return self.verify_s + self.verify_token_s * (n_tokens - 1)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EchoSpec:
        return cls(**json.loads(text))


def hello(role: str, spec: EchoSpec) -> msg.WorkerHello:
    return msg.WorkerHello(role, os.getpid(), spec.vocab, "cpu", list(spec.cores), 1, 0.0, backend="echo",
                           kernels="none (echo: no model)", prefill_threads=False)


def one_hot(rows: np.ndarray, tokens) -> None:
    """Each row the distribution certain of its token."""
    rows[:] = 0.0
    rows[np.arange(len(rows)), tokens] = 1.0


# ---- the target ---------------------------------------------------------------------------------

def load_target(spec: EchoSpec):
    return hello("target", spec), spec


def verify(spec: EchoSpec, cmd: msg.VerifyCommand, buffers):
    """The rule's token after each of the last `rows` input tokens; then, where asked, tokens ahead."""
    start = time.perf_counter()
    choice = echo_next(buffers["input"].array[cmd.n_tokens - cmd.rows:cmd.n_tokens], spec.vocab)
    buffers["choice"].array[:cmd.rows] = choice
    if cmd.sampling.rule is Rule.UNKEYED:
        one_hot(buffers["probs"].array[:cmd.rows], choice)
    reply = msg.Verified(cmd.request_id, spec.took(start, spec.verify_cost(cmd.n_tokens)))
    if cmd.ahead <= 0 or cmd.sampling.rule is Rule.UNKEYED:
        return reply
    return reply, run_ahead(spec, cmd, int(choice[-1]))


def run_ahead(spec: EchoSpec, cmd: msg.VerifyCommand, token: int):
    """As the real target's run_ahead: one token a step, each after the last choice."""
    position = cmd.keep + cmd.n_tokens
    for _ in range(cmd.ahead):
        start = time.perf_counter()
        after, token = token, int(echo_next(token, spec.vocab))
        position += 1
        yield msg.RanAhead(cmd.request_id, cmd.run, position, after, token, spec.took(start, spec.verify_s))


def calibrate_target(spec: EchoSpec, cmd: msg.CalibrateTarget, buffers) -> msg.TargetCalibration:
    return msg.TargetCalibration([spec.verify_cost(n) for n in cmd.sizes])


# ---- the draft ----------------------------------------------------------------------------------

class EchoDraft:
    def __init__(self, spec: EchoSpec):
        self.spec = spec

    def propose(self, after: int, position: int) -> int:
        """The draft's token at `position`, after `after`: the rule's, or one off at a miss."""
        token = int(echo_next(after, self.spec.vocab))
        k = self.spec.miss_every
        if k > 0 and position % k == k - 1:
            token = FIRST + (token + 1 - FIRST) % (self.spec.vocab - FIRST)
        return token

    def grow(self, branch: list[int], position: int, length: int) -> list[int]:
        """branch (whose first token sits at `position`) drafted on to `length` tokens."""
        while len(branch) < length:
            branch.append(self.propose(branch[-1], position + len(branch)))
        return branch

    def branches(self, last: int, position: int, gamma: int, plan) -> list[list[int]]:
        """Likeliest first, as the real drafter returns them: one plain sequence, or the
        plan's branches, each from another candidate first token (the guess, then the
        tokens after it)."""
        guess = self.propose(last, position)
        lengths = [gamma] if plan is None else self.budgets(gamma, plan)
        firsts = [FIRST + (guess + i - FIRST) % (self.spec.vocab - FIRST) for i in range(len(lengths))]
        return [self.grow([first], position, n) for first, n in zip(firsts, lengths)]

    @staticmethod
    def budgets(gamma: int, plan) -> list[int]:
        if gamma < 4 or plan.max_sequences <= 1:
            return [gamma]
        if plan.sequences != "dynamic":
            return split_budget(gamma, plan.sequences)
        return allocate_budget(gamma, list(DYNAMIC_FIRST[:plan.max_sequences]), plan.acceptance)


def load_draft(spec: EchoSpec):
    return hello("draft", spec), EchoDraft(spec)


def prefill(state: EchoDraft, cmd: msg.PrefillDraft, buffers) -> msg.Prefilled:
    return msg.Prefilled(cmd.request_id, state.spec.took(time.perf_counter(), state.spec.draft_s / 8 * cmd.context_len))


def draft(state: EchoDraft, cmd: msg.DraftWindow, buffers):
    """As the real draft worker's: the branches in slot order (likeliest last), probability
    rows under the unkeyed rule; then, where the plan asks, the likeliest branch grows."""
    start = time.perf_counter()
    context = buffers["context"].array[:cmd.context_len]
    branches = to_slot(state.branches(int(context[-1]), cmd.context_len, cmd.gamma, cmd.branches))
    flat = [t for branch in branches for t in branch]
    tokens = buffers["tokens"].array[cmd.slot]
    tokens[:len(flat)] = flat
    unkeyed = cmd.sampling.rule is Rule.UNKEYED
    if unkeyed:
        one_hot(buffers["probs"].array[cmd.slot, :len(flat)], flat)
    seconds = state.spec.took(start, state.spec.draft_s * len(flat))
    reply = msg.Drafted(cmd.request_id, cmd.slot, [len(b) for b in branches], seconds)
    room = len(tokens) - (len(flat) - len(branches[-1]))
    limit = min(cmd.branches.extend_to, room) if cmd.branches else 0
    if limit <= len(branches[-1]):
        return reply
    return reply, extension(state, cmd, buffers, branches[-1], len(flat), limit, start)


def extension(state: EchoDraft, cmd: msg.DraftWindow, buffers, branch: list[int], total: int, limit: int, start: float):
    """The likeliest branch grows a token at a time, each written before the message announcing it."""
    while len(branch) < limit:
        state.grow(branch, cmd.context_len, len(branch) + 1)
        buffers["tokens"].array[cmd.slot, total] = branch[-1]
        if cmd.sampling.rule is Rule.UNKEYED:
            one_hot(buffers["probs"].array[cmd.slot, total:total + 1], [branch[-1]])
        total += 1
        yield msg.DraftExtended(cmd.command, cmd.slot, total, state.spec.took(start, state.spec.draft_s * total))


def calibrate_draft(state: EchoDraft, cmd: msg.CalibrateDraft, buffers) -> msg.DraftCalibration:
    return msg.DraftCalibration(state.spec.draft_s, state.spec.draft_s / 8)


# ---- the process --------------------------------------------------------------------------------

ROLES = {
    "draft": (load_draft, {msg.PrefillDraft: prefill, msg.DraftWindow: draft, msg.CalibrateDraft: calibrate_draft}),
    "target": (load_target, {msg.VerifyCommand: verify, msg.CalibrateTarget: calibrate_target}),
}


def command(role: str, endpoint: str, spec: EchoSpec) -> list[str]:
    """The python arguments that start this worker (a WorkerCommand's)."""
    return ["-m", "hetspec.benchmarks.micro.echo_workers", role, "--endpoint", endpoint, "--spec", spec.to_json()]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ROLES:
        print(f"usage: echo_workers {{{','.join(ROLES)}}} --endpoint ENDPOINT --spec JSON", file=sys.stderr)
        return 2
    role, (load, handlers) = argv[0], ROLES[argv[0]]
    endpoint, spec = parse_args(argv[1:], EchoSpec)
    if spec.cores:
        pin(spec.cores)
    return serve(role, endpoint, spec, load, handlers)


if __name__ == "__main__":
    sys.exit(main())
