"""A transformers model as the target: any dtype, on the CPU or CUDA. Imported by the
target worker only for this backend: torch takes seconds to import, and the GGUF
backends (gguf_target.py) never use it."""
from __future__ import annotations

import os

import numpy as np
import torch

from hetspec.ipc.specs import TargetSpec
from hetspec.workers.common.hf_loading import eos_token_ids, load_causal_lm
from hetspec.workers.common.kv_model import KVModel, StaticKVModel
from hetspec.workers.common.pinning import CoreLoan, set_torch_threads
from hetspec.workers.target.captured import CapturedKVModel
from hetspec.workers.target.devices import resolve_device, running_caches
from hetspec.workers.target.gguf_linear import use_gguf_blocks
from hetspec.workers.target.packed_linear import pack_linears
from hetspec.workers.target.packed_pass import forward_batch


class TransformersTarget:
    """A transformers model (any dtype, CPU or CUDA) behind per-request KV caches."""

    def __init__(self, spec: TargetSpec, why: str = ""):
        self.device = device = resolve_device(spec.device)
        self.loan = CoreLoan(spec.cores, spec.borrow_cores if device == "cpu" else [], set_torch_threads, spec.threads)
        lm = load_causal_lm(spec.model, spec.dtype, device)
        cpu_kernels = spec.cpu_kernels if device == "cpu" else "torch"
        tuned_cpu = cpu_kernels in ("gguf", "onednn")
        attached, blocks = use_gguf_blocks(lm, spec.model, spec.dtype) if cpu_kernels == "gguf" else (False, "")
        self.packed_linears = pack_linears(lm) if tuned_cpu else 0
        if tuned_cpu:
            # transformers copies each shared KV head once per query head before a masked
            # (multi-token) attention on the CPU; torch's SDPA can share them itself: the
            # same logits bit for bit, sooner (measured: docs/kernels.md).
            os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
        self.kernels = f"onednn prepacked ({self.packed_linears} linear layers)" if self.packed_linears else "torch"
        if attached:
            self.kernels = blocks + (f"; {self.kernels}" if self.packed_linears else "")
        elif blocks:
            self.kernels += f"; {blocks}"
        self.passes = spec.passes if spec.passes != "auto" else "captured" if device != "cpu" else "eager"
        self.caches = running_caches(spec, device, self._cache_bytes(lm, spec))
        self.kv, passes_line = self._kv_model(lm, spec, device)
        self.kernels += passes_line
        self.kernels += why
        self.eos = eos_token_ids(self.kv.lm)
        self.n_vocab = self.kv.n_vocab
        self.last_caches = [0]            # what the last command ran on: a failed one's caches go (forget)

    def _kv_model(self, lm, spec: TargetSpec, device: str):
        """The KV model that runs self.passes, and what the kernels line says of it."""
        if self.passes == "eager":
            return KVModel(lm, device), ""
        kv = (CapturedKVModel(lm, device, spec.n_ctx, spec.max_window, self.caches) if self.passes == "captured"
              else StaticKVModel(lm, device, spec.n_ctx, spec.max_window))
        line = f"; static KV cache, windows padded to {', '.join(map(str, kv.sizes))} tokens"
        if self.passes == "captured":
            self._record_passes(kv, self.caches)
            line += (f", {kv.fallback}" if kv.fallback else
                     ", each recorded as a CUDA graph" if kv.graphs else ", recorded passes run eagerly (no CUDA)")
        return kv, line

    @staticmethod
    def _cache_bytes(lm, spec: TargetSpec) -> int:
        """A request's keys and values at full context (n_ctx and a window's padding)."""
        layers, kv_heads, head_dim, _ = KVModel(lm).geometry() or (0, 0, 0, 0)
        return 2 * layers * kv_heads * head_dim * (spec.n_ctx + spec.max_window) * lm.dtype.itemsize

    @staticmethod
    def _record_passes(kv: CapturedKVModel, caches: int) -> None:
        """Every cache's passes recorded now, at every padded size: a failure shows in the
        kernels line, the calibration that follows times replays, and no request's window
        waits for a recording. Then the batch passes, over each count of rows at each padded size."""
        for cache in range(caches):
            kv.use(cache)
            kv.forward([0], 0)
            for size in kv.sizes:
                kv.forward([0] * size, 1)
        for count in kv.row_counts[1:]:
            for size in kv.sizes:
                kv.forward_batch([(cache, [0] * size, 1, 1) for cache in range(count)])
        kv.use(0)

    def run(self, cache: int, tokens: np.ndarray, keep: int, rows: int, borrow: bool) -> torch.Tensor:
        """The logits of the last `rows` tokens, run after the cache's first `keep` positions."""
        self.last_caches = [cache]
        self.loan.hold(borrow)
        self.kv.use(cache)
        return self.kv.forward(tokens, keep, all_logits=rows > 1)[-rows:]

    def run_batch(self, windows: list[tuple], borrow: bool) -> list[torch.Tensor]:
        """Several requests' (cache, tokens, keep, rows) in one pass: packed (packed_pass.py),
        or where passes are captured, the recorded batch pass (captured.py)."""
        if len(windows) == 1:
            return [self.run(*windows[0], borrow)]
        self.last_caches = [window[0] for window in windows]
        self.loan.hold(borrow)
        return self.kv.forward_batch(windows) if self.passes == "captured" else forward_batch(self.kv, windows)

    def geometry(self) -> list[int]:
        return self.kv.geometry()

    def forget(self) -> None:
        for cache in self.last_caches:
            self.kv.use(cache)
            self.kv.forget()

    def export_kv(self, cache: int, length: int, kv: np.ndarray) -> None:
        """Cache `cache`'s first `length` positions into kv (2, layers, kv_heads, T, head_dim), float16."""
        self.last_caches = [cache]
        self.kv.use(cache)
        for i, (keys, values) in enumerate(self.kv.layer_kv(length)):
            kv[0, i, :, :length] = keys.to(torch.float16).cpu().numpy()
            kv[1, i, :, :length] = values.to(torch.float16).cpu().numpy()
