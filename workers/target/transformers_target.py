"""A transformers model as the target: any dtype, on the CPU or CUDA. Imported by the
target worker only for this backend: torch takes seconds to import, and the GGUF
backends (gguf_target.py) never use it."""
from __future__ import annotations

import os

import numpy as np
import torch

from hetspec.ipc.specs import TargetSpec
from hetspec.workers.common.hf_loading import eos_token_ids, load_causal_lm, resolve_dtype
from hetspec.workers.common.kv_model import KVModel, StaticKVModel, padded_sizes
from hetspec.workers.common.process import StartAfresh
from hetspec.workers.common.thread_pinning import CoreLoan, set_torch_threads
from hetspec.workers.target.attention import use_grouped_attention
from hetspec.workers.target.captured import CapturedKVModel, CaptureFailed, outputs_bytes
from hetspec.workers.target.devices import resolve_device, running_caches
from hetspec.workers.target.gguf_linear import use_gguf_blocks
from hetspec.workers.target.packed_linear import pack_linears
from hetspec.workers.target.packed_pass import forward_batch

EAGER_BECAUSE = "HETSPEC_TARGET_EAGER_BECAUSE"   # set for the fresh process after a failed capture: why


class TransformersTarget:
    """A transformers model (any dtype, CPU or CUDA) behind per-request KV caches."""

    def __init__(self, spec: TargetSpec, why: str = ""):
        self.device = device = resolve_device(spec.device)
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))     # cuda:N: streams, graphs and pools are the current device's
        self.loan = CoreLoan(spec.cores, spec.borrow_cores if device == "cpu" else [], set_torch_threads, spec.threads)
        dtype = resolve_dtype(spec.dtype, spec.model, device)
        lm = load_causal_lm(spec.model, dtype, device)
        cpu_kernels = spec.cpu_kernels if device == "cpu" else "torch"
        tuned_cpu = cpu_kernels in ("gguf", "onednn")
        attached, blocks = use_gguf_blocks(lm, spec.model, dtype) if cpu_kernels == "gguf" else (False, "")
        self.packed_linears = pack_linears(lm) if tuned_cpu else 0
        grouped = use_grouped_attention(lm)
        self.kernels = f"onednn prepacked ({self.packed_linears} linear layers)" if self.packed_linears else "torch"
        if attached:
            self.kernels = blocks + (f"; {self.kernels}" if self.packed_linears else "")
        elif blocks:
            self.kernels += f"; {blocks}"
        self.kernels += f"; {str(lm.dtype).removeprefix('torch.')}" + (" (dtype auto)" if spec.dtype == "auto" else "")
        self.kernels += "; grouped-query attention, keys and values unrepeated" if grouped else ""
        self.passes = spec.passes if spec.passes != "auto" else "captured" if device != "cpu" else "eager"
        self.caches = running_caches(spec, device, self._cache_bytes(lm, spec), self._outputs_bytes(lm, spec))
        try:
            self.kv, passes_line = self._kv_model(lm, spec, device)
        except CaptureFailed as exc:        # a fresh process, eager: CUDA's allocator may be left unusable
            raise StartAfresh(str(exc), {EAGER_BECAUSE: str(exc)}) from exc
        self.kernels += passes_line
        self.kernels += why
        self.eos = eos_token_ids(self.kv.lm)
        self.n_vocab = self.kv.n_vocab
        self.last_caches = [0]            # what the last command ran on: a failed one's caches go (forget)

    def _kv_model(self, lm, spec: TargetSpec, device: str):
        """The KV model that runs self.passes, and what the kernels line says of it."""
        if os.environ.get(EAGER_BECAUSE) and self.passes == "captured":
            self.passes = "eager"
            return KVModel(lm, device), f"; passes eager, started afresh: {os.environ[EAGER_BECAUSE]}"
        if self.passes == "eager":
            return KVModel(lm, device), ""
        kv = (CapturedKVModel(lm, device, spec.n_ctx, spec.max_window, self.caches) if self.passes == "captured"
              else StaticKVModel(lm, device, spec.n_ctx, spec.max_window))
        line = f"; static KV cache, windows padded to {', '.join(map(str, kv.sizes))} tokens"
        if self.passes == "captured":
            kv.record_all()
            line += f"; {kv.describe()}"
        return kv, line

    def _outputs_bytes(self, lm, spec: TargetSpec) -> int:
        """What captured passes' recordings will hold at the most caches (their final hidden states)."""
        if self.passes != "captured":
            return 0
        sizes = padded_sizes(spec.max_window)
        hidden = lm.config.get_text_config().hidden_size
        return outputs_bytes(spec.caches, spec.n_ctx + sizes[-1], sizes, hidden, lm.dtype.itemsize)

    @staticmethod
    def _cache_bytes(lm, spec: TargetSpec) -> int:
        """A request's keys and values at full context (n_ctx and a window's padding)."""
        layers, kv_heads, head_dim, _ = KVModel(lm).geometry() or (0, 0, 0, 0)
        return 2 * layers * kv_heads * head_dim * (spec.n_ctx + spec.max_window) * lm.dtype.itemsize

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
