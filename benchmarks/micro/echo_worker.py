"""A target worker that computes nothing, for timing IPC alone: the real worker loop, answering a
VerifyCommand through shared memory as the target worker does (choices, and rows when sampling).

    python -m hetspec.benchmarks.micro.echo_worker --endpoint ENDPOINT --spec '{"vocab": N, "rows": R}'
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import numpy as np

from hetspec.core.sampling import Rule
from hetspec.ipc.messages import Verified, VerifyCommand, WorkerHello
from hetspec.workers.common.process import parse_args, serve


@dataclass
class EchoSpec:
    vocab: int
    rows: int

    @classmethod
    def from_json(cls, text: str) -> EchoSpec:
        return cls(**json.loads(text))


def load(spec: EchoSpec):
    rng = np.random.default_rng(0)
    rows = rng.random((spec.rows, spec.vocab), dtype=np.float32)
    state = {"probs": rows / rows.sum(axis=1, keepdims=True)}
    return WorkerHello("target", os.getpid(), spec.vocab, "cpu", [], 1, 0.0), state


def verify(state: dict, cmd: VerifyCommand, buffers) -> Verified:
    tokens = buffers["input"].array[:cmd.n_tokens].copy()
    if cmd.sampling.rule is Rule.UNKEYED:
        buffers["probs"].array[:cmd.rows] = state["probs"][:cmd.rows]
    buffers["choice"].array[:cmd.rows] = tokens[-cmd.rows:]
    return Verified(cmd.request_id, 0.0)


def main(argv=None) -> int:
    endpoint, spec = parse_args(argv, EchoSpec)
    return serve("target", endpoint, spec, load, {VerifyCommand: verify})


if __name__ == "__main__":
    sys.exit(main())
