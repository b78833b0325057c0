"""Recorded greedy traces of a real target: per prompt (token ids), the tokens the target
chose after it, greedy, one file per target model. The paced target (paced.py) answers
from them; hetspec-bench --paced records the ones it lacks (benchmarks/bench/paced.py).

A file is JSON lines {"prompt": [ids], "tokens": [ids], "asked": n} (fewer tokens than
asked: the target ended the text there) in the folder given ([target] traces;
by default traces/ in hetspec's cache), named after the model file, its size and time: a
changed file gets no stale traces.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np


def trace_file(model_file: str, folder: str) -> Path:
    """The traces of model_file in folder ([target] traces, resolved by the config)."""
    stat = os.stat(model_file)
    return Path(folder).expanduser() / f"{Path(model_file).stem}-{stat.st_size}-{stat.st_mtime_ns}.jsonl"


class Trace(NamedTuple):
    prompt: np.ndarray
    full: np.ndarray        # the prompt, then the target's tokens
    asked: int              # the new tokens asked for when it was recorded

    def covers(self, new_tokens: int) -> bool:
        """Whether it answers a request of new_tokens (a trace that ended early answers any)."""
        return len(self.full) - len(self.prompt) >= new_tokens or self.asked >= new_tokens


def load_traces(path: Path) -> list[Trace]:
    """The file's traces (none if it does not exist), the longest of each prompt's."""
    if not path.is_file():
        return []
    traces: dict[tuple, Trace] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            prompt = np.asarray(row["prompt"], np.int64)
            full = np.concatenate([prompt, np.asarray(row["tokens"], np.int64)])
            trace, key = Trace(prompt, full, int(row.get("asked", len(row["tokens"])))), tuple(row["prompt"])
            if key not in traces or max(len(full), trace.asked) >= max(len(traces[key].full), traces[key].asked):
                traces[key] = trace
    return list(traces.values())


def add_trace(path: Path, prompt: list[int], tokens: list[int], asked: int) -> None:
    """Append one trace (a line written whole: a reader never sees half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {"prompt": [int(t) for t in prompt], "tokens": [int(t) for t in tokens], "asked": int(asked)}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


class Traces:
    """The traces of one model, and which one each cache's context follows."""

    def __init__(self, traces: list[Trace], caches: int):
        self.traces = traces
        self.following: list[np.ndarray | None] = [None] * caches

    def full(self, cache: int, context: np.ndarray) -> np.ndarray:
        """The trace (prompt + tokens) whose first len(context) tokens are context: the one
        this cache followed, or another whose prompt context starts with. ValueError where
        none is, naming why (no trace of this prompt, or the context left its trace)."""
        n = len(context)
        current = self.following[cache]
        if current is None or len(current) < n or not np.array_equal(current[:n], context):
            current = next((full for prompt, full, _ in self.traces
                            if len(prompt) <= n <= len(full) and np.array_equal(full[:n], context)), None)
            if current is None:
                raise ValueError(self._why_not(context))
            self.following[cache] = current
        return current

    def inside_a_prompt(self, context: np.ndarray) -> bool:
        """Whether context is a chunk of a recorded prompt, short of its end (a prompt read
        in chunks beside other requests: scheduler/batch.py, which reads no answer there)."""
        n = len(context)
        return any(n < len(prompt) and np.array_equal(prompt[:n], context) for prompt, _, _ in self.traces)

    def _why_not(self, context: np.ndarray) -> str:
        for prompt, full, _ in self.traces:
            if len(prompt) <= len(context) and np.array_equal(context[:len(prompt)], prompt):
                m = min(len(full), len(context))
                left = np.flatnonzero(full[:m] != context[:m])
                if len(left):
                    return (f"the context left its recorded trace at position {int(left[0])} (token "
                            f"{int(context[left[0]])}, the trace has {int(full[left[0]])}): a token the target "
                            "would not have chosen was committed")
                return (f"the context ({len(context)} tokens) runs past its recorded trace ({len(full) - len(prompt)} "
                        "tokens after the prompt): ask for fewer new tokens, or record a longer trace")
        return (f"no recorded trace for this prompt ({len(context)} tokens) among {len(self.traces)}: record it "
                "first (hetspec-bench --paced records the prompts it runs)")
