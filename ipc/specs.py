"""What a process is started with, typed: a worker's model and settings
(DraftSpec, TargetSpec: JSON on its command line), and the scheduler's run
file (RunSpec: the launcher writes it, the scheduler reads it).
"""
from __future__ import annotations

import dataclasses
import json
import os
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
    measure_threads: bool = False  # native: time 1, 2, 4, ... threads up to len(cores) at start-up, keep
                                   # the fastest (threads is then len(cores), for the other backends)
    vocab: int = 0             # native: score only the first `vocab` token ids (0: all)
    caches: int = 1            # native, > 1: a cache for each request stepped in a batch ([server] max_running)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DraftSpec:
        return build(cls, json.loads(text))


GGUF_TARGET_BACKENDS = ("native", "llama.cpp")   # [target] backends that run a GGUF file's own blocks, batch-invariant


@dataclass(frozen=True)
class TargetSpec:
    model: ModelSpec
    dtype: str
    device: str                # "auto", "cpu", "cuda" or "cuda:N"
    cores: list[int]
    threads: int
    cpu_kernels: str = "gguf"
    borrow_cores: list[int] = field(default_factory=list)   # the draft's, lent for prefills
    backend: str = "transformers"   # or one of GGUF_TARGET_BACKENDS, or "paced" (a simulated GPU target)
    n_ctx: int = 0             # llama.cpp: positions a cache holds
    caches: int = 1            # caches, one per request admitted at once ([server] max_running)...
    fit_caches: bool = False   # ...or, max_running "auto", the most: the worker keeps what its device holds
    profile: str = ""          # backend "paced": the GPU profile it charges (hetspec.core.gpu_profiles)
    traces: str = ""           # backend "paced": the folder of recorded traces ("": hetspec's cache)
    passes: str = "auto"       # transformers: "eager", "static" or "captured" ([target] passes; auto: by device)
    max_window: int = 0        # the longest verify window (max_gamma + 1): a static cache pads up to it

    to_json = DraftSpec.to_json

    @classmethod
    def from_json(cls, text: str) -> TargetSpec:
        return build(cls, json.loads(text))


@dataclass(frozen=True)
class Endpoints:
    client: str                # where clients reach the scheduler (ipc:// or tcp://)
    draft: str                 # where the scheduler reaches each worker (ipc://)
    target: str


@dataclass(frozen=True)
class WorkerCommand:
    """How the scheduler starts a worker: python `args`, with `threads` OpenMP threads."""
    args: list[str]
    threads: int


@dataclass(frozen=True)
class RunSpec:
    """The run file (runtime_dir/run.json): everything the scheduler is started with."""
    run_id: str
    config: dict               # hetspec.config.EngineConfig.to_dict(); the scheduler loads it (and so checks it)
    endpoints: Endpoints
    runtime_dir: str
    draft: WorkerCommand
    target: WorkerCommand
    draft_model: ModelSpec
    target_model: ModelSpec
    launcher_pid: int
    restarts: int = 0          # the scheduler's restarts before this one, and why (engine info)
    deaths: list[dict] = field(default_factory=list)   # {"at": time, "reason": how it ended}

    def save(self, path: str) -> None:
        """Written whole, then renamed: a scheduler never reads half a file."""
        partial = f"{path}.partial"
        with open(partial, "w") as f:
            json.dump(dataclasses.asdict(self), f)
        os.replace(partial, path)

    @classmethod
    def load(cls, path: str) -> RunSpec:
        with open(path) as f:
            return build(cls, json.load(f))
