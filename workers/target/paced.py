"""The paced target: a simulated GPU target. It answers the target worker's commands from
recorded greedy traces of a real target (traces.py), and charges each pass the time of a
named GPU profile (hetspec.core.gpu_profiles), sleeping meanwhile: like a GPU's, its
passes take no CPU, so the draft may have every core but the scheduler's.

It runs behind the real scheduler, IPC and draft, so what it measures is the engine's
own work around a GPU pass of known cost (the DuoDecoding setting, on any machine).
Greedy only: a trace holds the target's argmax at each position of one sequence.
Started by the target worker for [target] backend = "paced" (worker.py).
"""
from __future__ import annotations

import os
import time

import numpy as np

from hetspec.core.gpu_profiles import profile
from hetspec.core.sampling import Rule
from hetspec.ipc.messages import (
    CalibrateTarget,
    RanAhead,
    TargetCalibration,
    Verified,
    VerifyBatch,
    VerifyCommand,
    WorkerHello,
)
from hetspec.ipc.specs import TargetSpec
from hetspec.workers.common import gguf_vocab
from hetspec.workers.kernels.gguf_tensors import read_gguf
from hetspec.workers.target.traces import Traces, load_traces, trace_file

FILLER = 0    # the answer at a row past its trace's end: never committed (see PacedTarget.choices)


class PacedTarget:
    """Per cache, the tokens it holds; answers are the trace's tokens, after its pace."""

    def __init__(self, spec: TargetSpec):
        path = spec.model.file
        self.profile = profile(spec.profile)
        _, tensors = read_gguf(path)
        self.n_vocab = int(tensors["token_embd.weight"].shape[1])
        self.eos = gguf_vocab.end_of_generation_tokens(path)
        self.file = trace_file(path, spec.traces)
        recorded = load_traces(self.file)
        self.traces = Traces(recorded, spec.caches)
        self.held = [np.zeros(0, np.int64) for _ in range(spec.caches)]
        p = self.profile
        self.kernels = (f"paced target (simulated GPU), profile {p.name}: {p.window_ms:g} ms a pass of up to "
                        f"{p.flat_to} tokens, {len(recorded)} greedy traces from {self.file}")

    def choices(self, cache: int, tokens: np.ndarray, keep: int, rows: int) -> np.ndarray:
        """The target's token at each of the last `rows` positions after cache `cache`'s
        first `keep` tokens and `tokens`. Rows after a draft token the target would not
        choose are never committed (greedy acceptance stops at the first); past the
        trace's end they get FILLER, but the first row must be in it; so do the rows of a
        prompt's chunk short of its end."""
        context = np.concatenate([self.held[cache][:keep], tokens])
        self.held[cache] = context
        known = len(context) - rows + 1          # row i chooses the token at index known + i
        if self.traces.inside_a_prompt(context[:known]):
            return np.full(rows, FILLER, np.int32)   # a chunk of a prompt: its answer is never read
        full = self.traces.full(cache, context[:known])
        if known >= len(full):
            raise ValueError(f"position {known} is past the recorded trace ({len(full)} tokens with the prompt)")
        out = np.full(rows, FILLER, np.int32)
        inside = full[known:known + rows]
        out[:len(inside)] = inside
        return out

    def check_ahead(self, cache: int, last: int) -> None:
        """A run ahead to index `last` must stay in the trace, unless the trace ends the
        text before (the scheduler stops there): a run that stopped short would leave the
        scheduler waiting for a token that never comes."""
        full = self.traces.following[cache]
        if last >= len(full) and int(full[-1]) not in self.eos:
            raise ValueError(f"position {last} is past the recorded trace ({len(full)} tokens with the prompt): "
                             "ask for fewer new tokens, or record a longer trace")

    def wait(self, start: float, seconds: float) -> None:
        """Sleep until start + seconds: a GPU pass, which leaves the CPU alone."""
        left = start + seconds - time.perf_counter()
        if left > 0:
            time.sleep(left)


def load(spec: TargetSpec):
    start = time.perf_counter()
    state = PacedTarget(spec)
    hello = WorkerHello(role="target", pid=os.getpid(), n_vocab=state.n_vocab, device="paced", cores=spec.cores,
                        threads=1, load_s=time.perf_counter() - start, eos_token_ids=state.eos, backend="paced",
                        kernels=state.kernels, caches=spec.caches)
    return hello, state


def verify(state: PacedTarget, cmd: VerifyCommand, buffers):
    """The verdict on a window, after the profile's time for the pass; then, where asked,
    tokens decoded ahead at a one-token pass's pace each."""
    start = time.perf_counter()
    if cmd.sampling.rule is not Rule.GREEDY:
        raise ValueError("the paced target replays greedy traces: it answers greedy requests only (temperature 0)")
    choice = state.choices(cmd.cache, buffers["input"].array[:cmd.n_tokens], cmd.keep, cmd.rows)
    state.check_ahead(cmd.cache, cmd.keep + cmd.n_tokens + cmd.ahead)
    buffers["choice"].array[:cmd.rows] = choice
    state.wait(start, state.profile.pass_s(cmd.n_tokens, cmd.rows))
    reply = Verified(cmd.request_id, time.perf_counter() - start)
    if cmd.ahead <= 0:
        return reply
    return reply, run_ahead(state, cmd, int(choice[-1]))


def verify_batch(state: PacedTarget, cmd: VerifyBatch, buffers) -> Verified:
    """Several requests' verdicts, after the profile's time for one pass of all their
    tokens: a GPU batch is charged by its tokens, as one request's window is."""
    start, first, row = time.perf_counter(), 0, 0
    for c in cmd.commands:
        if c.sampling.rule is not Rule.GREEDY:
            raise ValueError("the paced target replays greedy traces: it answers greedy requests only (temperature 0)")
        tokens = buffers["input"].array[first:first + c.n_tokens]
        buffers["choice"].array[row:row + c.rows] = state.choices(c.cache, tokens, c.keep, c.rows)
        first, row = first + c.n_tokens, row + c.rows
    state.wait(start, state.profile.pass_s(first, row))
    return Verified(cmd.commands[0].request_id, time.perf_counter() - start)


def run_ahead(state: PacedTarget, cmd: VerifyCommand, token: int):
    """One paced pass a step, each after the last choice, until the next command (as the
    real worker's run_ahead) or the trace's end."""
    position = cmd.keep + cmd.n_tokens          # the index of `token`, the last choice
    for _ in range(cmd.ahead):
        start = time.perf_counter()
        try:
            after, token = token, int(state.choices(cmd.cache, np.array([token]), position, 1)[0])
        except ValueError:                      # the trace ends here: the next command says so, if it asks
            return
        state.wait(start, state.profile.pass_s(1, 1))
        position += 1
        yield RanAhead(cmd.request_id, cmd.run, position, after, token, time.perf_counter() - start)


def calibrate(state: PacedTarget, cmd: CalibrateTarget, buffers) -> TargetCalibration:
    """What a timed pass of each size would take: the profile's time (a pass is that, and
    start-up stays short)."""
    return TargetCalibration([state.profile.pass_s(n, n) for n in cmd.sizes])


def recover(state: PacedTarget) -> None:
    """After a failed command, each cache starts afresh (as the real target's)."""
    state.held = [np.zeros(0, np.int64) for _ in state.held]


HANDLERS = {VerifyCommand: verify, VerifyBatch: verify_batch, CalibrateTarget: calibrate}
