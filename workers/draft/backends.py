"""The draft-model interface and the one factory that builds a draft from its spec.

Backends: "native" (hetspec's own C step over a Llama, Qwen2, Qwen3 or Gemma 3 GGUF file's blocks,
workers/kernels/native_model.c), "llama.cpp" (any GGUF file, optionally
converted to another weight type, with a second copy for prompt prefill) and
"torch" (any transformers checkpoint). Where the native step cannot run this
file or CPU, llama.cpp drafts instead, and the description says why. llama.cpp is
the extra "llama": imported only when it drafts.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from hetspec.ipc.specs import DraftSpec
from hetspec.workers.common.extras import require_llama_cpp


class DraftModel(Protocol):
    """What the drafter needs of a model: one position-indexed KV cache."""
    n_vocab: int

    def forward(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        """Drop every cached position >= pos, run `tokens` there; the last token's
        logits (n_vocab,), possibly a view valid until the next call."""

    def kv_geometry(self) -> list[int]:
        """[layers, kv_heads, head_dim, full-attention layers] of a cache the
        target's KV can replace (import_kv); [] if it cannot."""

    def import_kv(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Replace the cache by positions 0..T-1: (layers, kv_heads, T, head_dim) float16."""

    def set_threads(self, n_threads: int) -> None: ...

    def close(self) -> None: ...


def load_draft_model(spec: DraftSpec) -> tuple[DraftModel, str, str]:
    """(model, backend that runs it, a description of how it runs)."""
    if spec.backend == "torch":
        from hetspec.workers.draft.torch_model import TorchDraftModel

        return TorchDraftModel(spec.model), "torch", "torch"
    why_not = ""
    if spec.backend == "native":
        from hetspec.workers.common.native_model import KernelUnavailable, NativeModel, Unsupported

        cache = spec.model.cache_dir
        try:
            native = NativeModel(spec.model.file, spec.n_ctx, os.path.dirname(cache) if cache else "",
                                 four_bit=spec.weights == "q4_1", vocab=spec.vocab, tiles=True)
            return native, "native", native.description
        except (KernelUnavailable, Unsupported) as exc:
            why_not = f" (no native draft: {exc})"
    require_llama_cpp(f"the draft's fallback to llama.cpp{why_not}" if why_not else "the llama.cpp draft backend")
    model = _llama_cpp(spec, spec.weights)
    kernels = f"llama.cpp, weights {spec.weights}"
    if spec.prefill_weights != "same":
        from hetspec.workers.draft.split_prefill import SplitPrefillModel

        model = SplitPrefillModel(model, _llama_cpp(spec, spec.prefill_weights))
        kernels += f", prompts prefilled as {spec.prefill_weights}"
    return model, "llama.cpp", kernels + why_not


def _llama_cpp(spec: DraftSpec, weights: str):
    """The draft GGUF in llama.cpp, converted to `weights` first unless "as-is"."""
    from hetspec.workers.draft.llama_cpp import LlamaCppModel

    path, converted = spec.model.file, weights != "as-is"
    if converted:
        from hetspec.workers.draft.gguf_conversion import convert_gguf

        path = convert_gguf(path, weights, spec.scratch_dir, spec.threads)
    try:
        return LlamaCppModel(path, n_ctx=spec.n_ctx, n_threads=spec.threads)
    finally:
        if converted:   # llama.cpp holds the weights in memory now
            os.unlink(path)
