"""A GGUF target run by hetspec's own kernels, a window at a time (workers/kernels/native_draft.c).

llama.cpp, set to be batch-invariant (llama_target.py), multiplies a verify window by
each weight matrix a token at a time, so a window of w tokens costs nearly w passes.
hs_forward_window unpacks each block of weights once for up to 8 tokens of the window
(window8.h) and gives every token the same float steps whatever window or prompt chunk
it came in, so its logits are the same bits. The weights are the file's values exactly:
Q8_0, Q4_0 and Q4_1 blocks as stored (Q8_0 laid out for the window kernels at load,
FMT_W8), Q5_0 as int8 quants beside its scales, K-quants as int8 quants with float scales
(FMT_I8: more bytes than the file, the same values).
Activations are rounded to int8 as llama.cpp rounds them for each weight type (int16,
a token at a time, on CPUs without AVX-512 VNNI). The output layer is one more window
product (on CPUs without AVX-512 VNNI, a Q8_0 one goes through output_head.c instead).
When the target runs alone on borrowed cores, every product's rows are split among
threads (pool.h), each row computed as on one thread.
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

import numpy as np

from hetspec.workers.common import gguf_vocab
from hetspec.workers.draft.native import NativeDraftModel
from hetspec.workers.kernels import output_head
from hetspec.workers.target.windows import checked_window


class NativeTarget:
    """A GGUF model with one KV cache per cache number, computed by native_draft.c."""

    def __init__(self, path: str, n_ctx: int, caches: int, threads: int, cache_root: str = ""):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        self._net = NativeDraftModel(path, n_ctx, cache_root, fast_head=False, exact_kquants=True, window_layout=True)
        lib, model = self._net._lib, self._net._model
        lib.hs_window_logits.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.hs_window_bits.restype = ctypes.c_int
        lib.hs_set_threads.restype = ctypes.c_int
        lib.hs_set_threads.argtypes = [ctypes.c_int]
        lib.hs_thread_ids.restype = ctypes.c_int
        lib.hs_thread_ids.argtypes = [ctypes.c_void_p]
        lib.hs_pool_rest.restype = None
        self._lib, self._model, self._ref = lib, model, ctypes.byref(model)
        self.max_window = self._net.max_window
        first = (self._net._kcache, self._net._vcache)
        self._caches = [first] + [(np.zeros_like(first[0]), np.zeros_like(first[1])) for _ in range(caches - 1)]
        self._norms = np.zeros((self.max_window, model.n_embd), np.float32)
        self._tokens = np.zeros(self.max_window, np.int32)
        # With 8-bit windows the output layer takes the window's products on the pool's
        # threads, faster than output_head.c at any window; without them a Q8_0 output
        # layer takes output_head.c's kernel.
        bits = lib.hs_window_bits()
        weights, why = output_head.head_matrix(path) if bits != 8 else (None, "8-bit windows")
        self._head = None
        if weights is not None:
            self._head, self._head_weights = output_head.library(cache_root), weights
        self.n_vocab, self.n_ctx, self.caches = model.n_vocab, n_ctx, caches
        self.set_threads(threads)
        self.lengths = [0] * caches
        self.eos_token_ids = end_of_generation_tokens(path)
        self.description = self._net.description.replace("native, ", "") + (
            f", activations in {bits} bits" + (
                "; output layer: hetspec's Q8_0 kernel, a window at once" if self._head is not None
                else f"; output layer through the window's products ({why})"))

    def forward(self, cache: int, tokens: Sequence[int], keep: int, rows: int) -> np.ndarray:
        """Drop cache `cache`'s positions >= keep, run `tokens` there; the logits of the
        last `rows` tokens, (rows, n_vocab) float32."""
        ids = checked_window(self, cache, tokens, keep, rows)
        n = ids.size
        self._model.kcache, self._model.vcache = (a.ctypes.data for a in self._caches[cache])
        self.lengths[cache] = keep      # a failed pass leaves it here
        logits = np.empty((rows, self.n_vocab), dtype=np.float32)
        first_row = n - rows
        for start in range(0, n, self.max_window):
            m = min(self.max_window, n - start)
            self._tokens[:m] = ids[start:start + m]
            self._net.forward_window(self._tokens[:m], keep + start, self._norms)
            self.lengths[cache] = keep + start + m
            if start + m > first_row:
                skip = max(0, first_row - start)
                self._logits(self._norms[skip:m], logits[start + skip - first_row:start + m - first_row])
        self._lib.hs_pool_rest()
        return logits

    def _logits(self, norms: np.ndarray, out: np.ndarray) -> None:
        n = len(norms)
        if self._head is None:
            self._lib.hs_window_logits(self._ref, norms.ctypes.data, n, out.ctypes.data)
            return
        output_head.head_logits(self._head, self._head_weights, self._model.n_embd, norms, n, out, self.threads)

    def forget(self, cache: int) -> None:
        self.lengths[cache] = 0

    def set_threads(self, threads: int) -> None:
        """Threads for the products and the output layer: more when the target runs alone
        on borrowed cores, one while the draft runs beside it."""
        self.threads = self._lib.hs_set_threads(threads)

    def thread_ids(self) -> list[int]:
        """The kernel ids of the threads that share the products with the caller's, for pinning."""
        tids = np.zeros(64, np.int32)
        return tids[:self._lib.hs_thread_ids(tids.ctypes.data)].tolist()

    def close(self) -> None:
        self._net.close()


def end_of_generation_tokens(path: str) -> list[int]:
    """The file's end-of-generation tokens, as llama.cpp's vocabulary reads them (from the
    file's metadata: no llama.cpp needed)."""
    return gguf_vocab.end_of_generation_tokens(path)
