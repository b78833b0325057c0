"""What a worker process is started with: its model and its settings, typed.

The launcher builds these from the config and passes each to its worker as
JSON on the command line; the worker reads them back with from_json.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from hetspec.ipc.codec import build


@dataclass(frozen=True)
class ModelSpec:
    """A model resolved to something a worker can load without guessing (hetspec.models)."""
    kind: str                  # "gguf", "dir", "hub" or "random"
    path: str = ""             # directory (gguf/dir), hub id, or "" for random
    gguf_file: str = ""        # file name inside `path` for kind "gguf"
    random: dict | None = None  # config values for kind "random"
    cache_dir: str = ""        # kind "gguf": where its transformers form is kept ("" keeps none)

    @property
    def file(self) -> str:
        return str(Path(self.path) / self.gguf_file) if self.gguf_file else self.path


@dataclass(frozen=True)
class DraftSpec:
    backend: str               # "native", "llama.cpp" or "torch" (see [draft] backend)
    model: ModelSpec
    cores: list[int]
    threads: int
    n_ctx: int
    weights: str = "as-is"     # llama.cpp: a weight type to convert the GGUF file to at load
    prefill_weights: str = "same"  # llama.cpp: a second copy that prefills long prompts
    prompt_kv: str = "own"     # "auto": report a cache layout the target's KV can replace
    scratch_dir: str = ""      # where converted weights are written (and removed once loaded)
    borrow_cores: list[int] = field(default_factory=list)   # the target's, lent for prefills

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DraftSpec:
        return build(cls, json.loads(text))


@dataclass(frozen=True)
class TargetSpec:
    model: ModelSpec
    dtype: str
    device: str                # "auto", "cpu", "cuda" or "cuda:N"
    cores: list[int]
    threads: int
    cpu_kernels: str = "gguf"
    borrow_cores: list[int] = field(default_factory=list)   # the draft's, lent for prefills

    to_json = DraftSpec.to_json

    @classmethod
    def from_json(cls, text: str) -> TargetSpec:
        return build(cls, json.loads(text))
