"""A GGUF file's own weights as the target, on the CPU: run by hetspec's kernels
(backend "native", native_target.py) or by llama.cpp (llama_target.py), batch-invariant
either way. Imported only for those backends; only the llama.cpp one loads llama.cpp (the
extra "llama"), and only when chosen."""
from __future__ import annotations

import os

import numpy as np

from hetspec.ipc.specs import TargetSpec
from hetspec.workers.common.extras import require_llama_cpp
from hetspec.workers.common.thread_pinning import CoreLoan
from hetspec.workers.target.native_target import NativeTarget


def llama_backend():
    """The llama.cpp backend's module (llama_target.py), imported on first use; ImportError
    in one line naming the extra to install where llama-cpp-python is missing."""
    require_llama_cpp("the llama.cpp target backend")
    from hetspec.workers.target import llama_target

    return llama_target


class GGUFTarget:
    """Either backend behind the target worker's interface (run, geometry, forget), as
    TransformersTarget is in worker.py."""

    def __init__(self, spec: TargetSpec):
        self.device = "cpu"
        cache_root = os.path.dirname(spec.model.cache_dir) if spec.model.cache_dir else ""
        if spec.backend == "native":
            self.model = NativeTarget(spec.model.file, spec.n_ctx, spec.caches, spec.threads, cache_root)
            self.kernels = (f"native ({self.model.isa}), batch-invariant ({self.model.max_window} tokens a pass): "
                            f"{self.model.description}")
        else:
            llama = llama_backend()
            self.model = llama.LlamaTarget(spec.model.file, spec.n_ctx, spec.caches, spec.threads, cache_root)
            head = "hetspec's Q8_0 kernel, a window at once" if self.model.head else \
                f"llama.cpp's ({self.model.head_why})"
            self.kernels = f"llama.cpp, batch-invariant (no repacking, no tiled K-quant products, flash attention, " \
                           f"{llama.MAX_PASS} tokens a pass); output layer: {head}"
        self.loan = CoreLoan(spec.cores, spec.borrow_cores, self.model.set_threads, spec.threads,
                             getattr(self.model, "thread_ids", None))
        self.n_vocab, self.eos = self.model.n_vocab, self.model.eos_token_ids
        self.last_caches = [0]            # what the last command ran on: a failed one's caches go (forget)

    def run(self, cache: int, tokens: np.ndarray, keep: int, rows: int, borrow: bool) -> np.ndarray:
        self.last_caches = [cache]
        self.loan.hold(borrow)
        return self.model.forward(cache, tokens, keep, rows)

    def run_batch(self, windows: list[tuple], borrow: bool) -> list[np.ndarray]:
        """Several requests' (cache, tokens, keep, rows): the native kernels run them in one
        pass (NativeTarget.forward_batch); llama.cpp's target runs them one after another."""
        self.last_caches = [window[0] for window in windows]
        self.loan.hold(borrow)
        if hasattr(self.model, "forward_batch"):
            return self.model.forward_batch(windows)
        return [self.model.forward(*window) for window in windows]

    def geometry(self) -> list[int]:
        return []       # its cache is its own: no draft takes it over

    def forget(self) -> None:
        for cache in self.last_caches:
            self.model.forget(cache)
