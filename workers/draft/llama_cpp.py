"""Draft model backed by llama.cpp's low-level C API (via llama-cpp-python).

The high-level ``llama_cpp.Llama`` keeps an n_ctx x n_vocab scores array when
asked for per-token logits; speculative drafting only ever needs the logits of
the last token, so we drive llama_decode directly and read one row.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np

from hetspec.workers.common.llama_handles import free, open_model

llama_cpp.llama_backend_init()
SINGLE_PASSES_UP_TO = 3   # tokens; see forward()


class LlamaCppModel:
    """A GGUF draft model run by llama.cpp with a position-indexed KV cache."""

    def __init__(self, path: str, n_ctx: int = 4096, n_threads: int = 1):
        """Load `path` and create a single-sequence context of `n_ctx` positions.

        llama.cpp may round n_ctx up (to a multiple of 256); `self.n_ctx` is the real size.
        """
        self._model = self._ctx = self._batch = None
        self._state_layout = None
        self._n_batch = min(n_ctx, 512)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = self._n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads
        # Keep the whole sliding-window (SWA) cache, e.g. for Gemma 3: a reduced
        # SWA cache drops old positions, and rolling back then cannot restore them.
        params.swa_full = True
        self._model, self._ctx = open_model(path, params, shape=f"n_ctx={n_ctx}")

        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx: int = llama_cpp.llama_n_ctx(self._ctx)

        # One reusable batch; every slot belongs to sequence 0. numpy views let
        # us fill token/pos/output flags without per-token Python loops.
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        for i in range(self._n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(self._n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(self._n_batch,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(self._n_batch,))

    def forward(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        """Drop every cached position >= pos, evaluate `tokens` at positions pos..pos+len-1 and
        return the logits of the last one as a float32 array of shape (n_vocab,).
        The array may be a view into llama.cpp's buffer, valid until the next call."""
        self._check_open()
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = ids.size
        if n == 0:
            raise ValueError("forward() needs at least one token")
        if pos < 0 or pos + n > self.n_ctx:
            raise ValueError(f"positions {pos}..{pos + n - 1} do not fit in n_ctx={self.n_ctx}")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"token ids must be in [0, {self.n_vocab}), got min={ids.min()} max={ids.max()}")
        # The cache must hold every position before `pos`, else attention would see a hole.
        n_cached = llama_cpp.llama_memory_seq_pos_max(self._mem, 0) + 1
        if pos > n_cached:
            raise ValueError(f"pos={pos} but only positions 0..{n_cached - 1} are cached")
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, pos, -1):
            raise RuntimeError(f"llama.cpp could not drop cached positions >= {pos}")

        # A pass of 2 or 3 tokens took longer than as many single-token passes
        # (llamafile's batched kernels; measured: e7e822d:docs/kernels.md), so they go
        # one at a time.
        step = 1 if n <= SINGLE_PASSES_UP_TO else self._n_batch
        for start in range(0, n, step):
            m = min(step, n - start)
            self._tok[:m] = ids[start:start + m]
            self._pos[:m] = np.arange(pos + start, pos + start + m)
            self._out[:m] = 0
            self._out[m - 1] = start + m == n  # only the call's last token needs logits
            self._batch.n_tokens = m
            rc = llama_cpp.llama_decode(self._ctx, self._batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} at positions "
                                   f"{pos + start}..{pos + start + m - 1}")
        logits = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,))

    def export_cache(self, length: int) -> ctypes.Array:
        """The KV state of the first `length` cached positions (llama.cpp's
        per-sequence format); later ones are dropped."""
        self._check_open()
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, length, -1):
            raise RuntimeError(f"llama.cpp could not drop cached positions >= {length}")
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        state = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, state, size, 0)
        if written == 0 and size:
            raise RuntimeError("llama.cpp could not export the KV state")
        return state

    def import_cache(self, state: ctypes.Array) -> None:
        """Replace the cache by one exported from a model of the same architecture;
        the next forward continues after its last position."""
        self._check_open()
        llama_cpp.llama_memory_seq_rm(self._mem, 0, 0, -1)
        if llama_cpp.llama_state_seq_set_data(self._ctx, state, len(state), 0) != len(state):
            raise RuntimeError("llama.cpp could not import the KV state (another architecture?)")

    def kv_geometry(self) -> list[int]:
        """[layers, kv_heads, head_dim, full-attention layers] of a cache another
        model's KV can replace (the full-attention layers come first in it); []
        when it cannot (a state layout this module does not know)."""
        self._check_open()
        try:
            layout = self._layout()
        except ValueError:
            return []
        sliding = llama_cpp.llama_model_n_swa(self._model) > 0
        if layout.n_layer != llama_cpp.llama_model_n_layer(self._model) or len(layout.sections) != 1 + sliding:
            return []
        heads = llama_cpp.llama_model_n_head_kv(self._model)
        return [layout.n_layer, heads, layout.kv_dim // heads, layout.sections[0]]

    def import_kv(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Replace the cache by positions 0..T-1 given as (layers, kv_heads, T, head_dim)
        float16 keys (post-RoPE, transformers' order) and values, layers in the
        order kv_geometry gives; see llama_kv_state and rope_order."""
        from hetspec.workers.common.rope_order import to_llama_order
        from hetspec.workers.draft.llama_kv_state import build_state

        keys = to_llama_order(keys, llama_cpp.llama_model_rope_type(self._model))
        state = build_state(self._layout(), keys, values)
        self.import_cache((ctypes.c_uint8 * len(state)).from_buffer(state))

    def _layout(self):
        """How this context writes a sequence's state, read once from a one-token state."""
        from hetspec.workers.draft.llama_kv_state import read_layout

        if self._state_layout is None:
            self.forward([0], 0)
            self._state_layout = read_layout(bytes(self.export_cache(1)))
        return self._state_layout

    def set_threads(self, n_threads: int) -> None:
        llama_cpp.llama_set_n_threads(self._ctx, n_threads, n_threads)

    def _check_open(self) -> None:
        if not self._ctx:
            raise RuntimeError("LlamaCppModel is closed")

    def close(self) -> None:
        """Free batch, context and model; safe to call more than once."""
        free(self._batch, self._ctx, self._model)
        self._batch = self._ctx = self._model = None
