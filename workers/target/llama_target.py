"""A GGUF target run by llama.cpp, set so that a window's logits are a one-token pass's, bit for bit.

llama.cpp's default CPU products are not batch-invariant: a window of w tokens gives
other logits than the same tokens one at a time (up to 3 apart on Gemma 3 270M), so
its speculative output can differ from its plain output. Three settings of the
installed build make every product of a window compute each row as a one-token pass
does (benchmarks/reports/llama-invariance, made at commit 5e66ca1):
- weights are not repacked (use_extra_bufts off): repacked products differ by batch;
- ggml's tiled K-quant products are off (GGML_CPU_TILED_MM=0, read once, at the
  process's first product, hence set at import);
- flash attention is on, with fewer than 64 queries a pass: without it the attention
  products change with the batch, and its own tiled path starts at 64 queries.
So every pass holds at most MAX_PASS tokens, prompts included. Decoding speed is
llama.cpp's own (the report times each setting). One kind of product stays
batch-dependent in a build with llamafile's sgemm (llama-cpp-python's default):
float weights (F32, F16, BF16) multiply a batch through it, one token through
ggml's own dot product. Such a file is refused there (float_products); a build
with GGML_LLAMAFILE=OFF runs it exactly.

Those settings multiply a window by each weight matrix a token at a time, so a window
of w tokens costs nearly w one-token passes; most of that is the output layer when the
vocabulary is large (Gemma 3: 262,144 rows). Where the output layer is Q8_0, llama.cpp
stops at the final norm and workers/kernels/output_head.c computes the logits with
llama.cpp's arithmetic, reading each weight row once for the whole window.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hetspec.workers.common.llama_handles import free, open_model
from hetspec.workers.kernels import output_head
from hetspec.workers.target.forward_checks import checked_window

os.environ["GGML_CPU_TILED_MM"] = "0"     # ggml reads it once, at the process's first product

import llama_cpp

llama_cpp.llama_backend_init()
MAX_PASS = 32           # tokens a llama_decode call: under flash attention's tiled path (64)
FLASH_ATTENTION_ON = 1  # llama_flash_attn_type: -1 auto, 0 off, 1 on


LLAMAFILE = b"LLAMAFILE = 1" in llama_cpp.llama_print_system_info()


def float_products(path: str) -> list[str]:
    """The matrices of a GGUF file kept as floats that multiply activations ("name TYPE")."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    floats = {"F32", "F16", "BF16"}
    return [f"{name} {t.tensor_type.name}" for name, t in tensors.items()
            if len(t.shape) >= 2 and t.tensor_type.name in floats
            and not (name == "token_embd.weight" and "output.weight" in tensors)]   # a lookup, unless tied


class LlamaTarget:
    """A GGUF model with one llama.cpp sequence (a KV cache) per cache number."""

    def __init__(self, path: str, n_ctx: int, caches: int, threads: int, cache_root: str = "",
                 own_output_layer: bool = True):
        if not os.path.isfile(path):    # read here before llama.cpp opens it (its float products, its output layer)
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        if LLAMAFILE and (floats := float_products(path)):
            raise ValueError(f"{path} multiplies by float weights ({floats[0]}, and {len(floats) - 1} more), which "
                             "this llama.cpp build (with llamafile's sgemm) does not compute batch-invariantly: use a "
                             "quantized file, [target] backend = \"transformers\", or llama-cpp-python built with "
                             "CMAKE_ARGS=-DGGML_LLAMAFILE=OFF")
        self._model = self._ctx = self._batch = None
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_seq_max, params.kv_unified = n_ctx * caches, caches, False
        params.n_batch = params.n_ubatch = MAX_PASS
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = FLASH_ATTENTION_ON
        params.swa_full = True      # a whole sliding-window cache, so any position can be rolled back to
        self.head, self.head_why = output_head.load(path, MAX_PASS, cache_root) if own_output_layer else (None, "asked")
        if self.head is not None:
            params.cb_eval, params.cb_eval_user_data = self.head.callback, self.head.user_data
        self.threads = threads
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = False
        self._model, self._ctx = open_model(path, params, mparams, f"n_ctx={n_ctx}, caches={caches}")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx) // caches
        self.eos_token_ids = [t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        self.caches = caches
        self.lengths = [0] * caches
        self._batch = llama_cpp.llama_batch_init(MAX_PASS, 0, 1)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(MAX_PASS,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(MAX_PASS,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(MAX_PASS,))
        for i in range(MAX_PASS):
            self._batch.n_seq_id[i] = 1

    def forward(self, cache: int, tokens: Sequence[int], keep: int, rows: int) -> np.ndarray:
        """Drop cache `cache`'s positions >= keep, run `tokens` there; the logits of the
        last `rows` tokens, (rows, n_vocab) float32."""
        ids = checked_window(self, cache, tokens, keep, rows)
        n = ids.size
        llama_cpp.llama_memory_seq_rm(self._mem, cache, keep, -1)
        self.lengths[cache] = keep      # a failed pass leaves it here
        logits = np.empty((rows, self.n_vocab), dtype=np.float32)
        first_row = n - rows
        for start in range(0, n, MAX_PASS):
            m = min(MAX_PASS, n - start)
            self._tok[:m] = ids[start:start + m]
            self._pos[:m] = np.arange(keep + start, keep + start + m)
            self._out[:m] = np.arange(start, start + m) >= first_row
            for i in range(m):
                self._batch.seq_id[i][0] = cache
            self._batch.n_tokens = m
            self._decode(keep + start, m)
            self.lengths[cache] = keep + start + m
            if start + m > first_row:
                self._logits(logits, max(start, first_row) - first_row, max(0, first_row - start), m)
        return logits

    def _decode(self, pos: int, m: int) -> None:
        if self.head is not None:
            self.head.before_pass()
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} at positions {pos}..{pos + m - 1}")

    def _logits(self, logits: np.ndarray, at: int, first: int, m: int) -> None:
        """The pass's rows first..m-1 into logits[at:]; they are its output rows, in order."""
        n = m - first
        if self.head is not None and not self.head.reached():
            self.head, self.head_why = None, "llama.cpp's graph for it has no final norm to stop at"
        if self.head is not None:
            self.head.logits(n, logits[at:at + n], self.threads)
            return
        for i in range(n):
            row = llama_cpp.llama_get_logits_ith(self._ctx, first + i)
            logits[at + i] = np.ctypeslib.as_array(row, shape=(self.n_vocab,))

    def forget(self, cache: int) -> None:
        """Empty one cache (after a failed pass it may be half written)."""
        llama_cpp.llama_memory_seq_rm(self._mem, cache, 0, -1)
        self.lengths[cache] = 0

    def set_threads(self, threads: int) -> None:
        llama_cpp.llama_set_n_threads(self._ctx, threads, threads)
        self.threads = threads

    def close(self) -> None:
        """Free batch, context and model; safe to call more than once."""
        free(self._batch, self._ctx, self._model)
        self._batch = self._ctx = self._model = None
