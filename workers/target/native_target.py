"""A GGUF target run by hetspec's own kernels, a window at a time (the native model,
workers/common/native_model.py and workers/kernels/native_model.c).

llama.cpp, set to be batch-invariant (llama_target.py), multiplies a verify window by
each weight matrix a token at a time, so a window of w tokens costs nearly w passes.
hs_forward_window unpacks each block of weights once for several tokens of the window
(window_avx512.c with AVX-512 VNNI, window_avx2.c elsewhere) and gives every token the same
float steps whatever window or prompt chunk it came in, so its logits are the same bits.
The weights are the file's values exactly (native_weights.py, EXACT_LAYOUTS): Q8_0, Q4_0 and Q4_1 blocks
as stored, Q5_0 as int8 quants beside its scales, Q4_K and Q6_K at their own size where
the AVX2 products read them; where the AVX-512 ones do, Q4_1, Q8_0, Q4_K and Q6_K in tiles
of 16 rows (FMT_T*); other K-quants and Q5_1 as int8 quants with float scales.
Activations are rounded to int8 as llama.cpp rounds them for each weight type. The
output layer is one more window product.
When the target runs alone on borrowed cores, every product's rows are split among
threads (pool.h), each row computed as on one thread.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hetspec.workers.common import gguf_vocab
from hetspec.workers.common.native_model import NativeModel
from hetspec.workers.target.forward_checks import checked_window


class NativeTarget:
    """A GGUF model with one KV cache per cache number, computed by native_model.c."""

    def __init__(self, path: str, n_ctx: int, caches: int, threads: int, cache_root: str = ""):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        self._net = NativeModel(path, n_ctx, cache_root, fast_head=False, exact_kquants=True, window_layout=True)
        self._lib, model = self._net._lib, self._net._model
        self.max_window = self._net.max_window
        self._caches = [self._net.cache(i) for i in range(caches)]
        self.n_vocab, self.n_ctx, self.caches = model.n_vocab, n_ctx, caches
        self.set_threads(threads)
        self.lengths = [0] * caches
        self.eos_token_ids = end_of_generation_tokens(path)
        self.isa = self._net.isa
        self.description = self._net.description.replace(f"native ({self.isa}), ", "", 1) + (
            ", activations in 8 bits; output layer through the window's products")

    def forward(self, cache: int, tokens: Sequence[int], keep: int, rows: int) -> np.ndarray:
        """Drop cache `cache`'s positions >= keep, run `tokens` there; the logits of the
        last `rows` tokens, (rows, n_vocab) float32."""
        return self.forward_batch([(cache, tokens, keep, rows)])[0]

    def forward_batch(self, windows: Sequence[tuple[int, Sequence[int], int, int]]) -> list[np.ndarray]:
        """Several requests' windows, (cache, tokens, keep, rows) each, a cache at most once,
        run together in passes of up to max_window tokens, each window in its own cache:
        each one's logits as forward gives them, the same bits as run alone
        (hs_forward_batch)."""
        caches = [window[0] for window in windows]
        if len(set(caches)) < len(caches):
            raise ValueError(f"a batch runs each cache once, got caches {caches}")
        ids = [checked_window(self, *window) for window in windows]
        tokens = np.concatenate(ids).astype(np.int32)
        positions = np.concatenate([np.arange(keep, keep + n.size) for (_, _, keep, _), n in zip(windows, ids)])
        positions = positions.astype(np.int32)
        kcaches, vcaches = (np.concatenate([np.full(n.size, self._caches[c][i].ctypes.data, np.uint64)
                                            for c, n in zip(caches, ids)]) for i in (0, 1))
        wanted = np.concatenate([np.arange(n.size) >= n.size - window[3] for window, n in zip(windows, ids)])
        for cache, _, keep, _ in windows:
            self.lengths[cache] = keep      # a failed pass leaves it here
        logits = self._net.window_logits(self._net.forward_rows(tokens, positions, kcaches, vcaches, wanted))
        self._lib.hs_pool_rest()
        for (cache, _, keep, _), n in zip(windows, ids):
            self.lengths[cache] = keep + n.size
        return np.split(logits, np.cumsum([window[3] for window in windows])[:-1])

    def forget(self, cache: int) -> None:
        self.lengths[cache] = 0

    def set_threads(self, threads: int) -> None:
        """Threads for the products and the output layer: more when the target runs alone
        on borrowed cores, one while the draft runs beside it."""
        self.threads = self._net.set_threads(threads)

    def thread_ids(self) -> list[int]:
        """The kernel ids of the threads that share the products with the caller's, for pinning."""
        return self._net.thread_ids()

    def close(self) -> None:
        self._net.close()


def end_of_generation_tokens(path: str) -> list[int]:
    """The file's end-of-generation tokens, as llama.cpp's vocabulary reads them (from the
    file's metadata: no llama.cpp needed)."""
    return gguf_vocab.end_of_generation_tokens(path)
