"""The native model: a Llama-, Qwen2-, Qwen3- or Gemma-3-architecture GGUF model run by
workers/kernels/native_model.c, which both workers load: the native draft as it is
(workers/draft/backends.py), the native target with every weight exact
(workers/target/native_target.py, exact_kquants and window_layout).

A token takes the one-token step (hs_forward), activations rounded to 16 bits; the
draft takes it, and its Q8_0 output layer is read mostly in a Q4_1 copy made at load
(head() in the C file). A window of tokens (hs_forward_window) goes through the window
products, which read each block of weights once for the window: the target's verify
windows and prompt chunks, and a draft's long feed (a prompt, a catch-up after it
rested), all but its last token, which fills the cache about 3x faster a token but,
with 8-bit activations, further from the float model's (see WINDOW_FILL). How the
file's tensors are held: native_weights.py. Behind the DraftModel protocol of
workers/draft/backends.py (forward, kv_geometry, import_kv), so the drafter and the KV
handover work with any backend. Its cache is positional: a forward at `pos` simply
overwrites from there, which is all a rollback needs (and all a step halted midway,
forward's `halt`, leaves to clean up). Every product's rows, a step's and a window's,
are split among the process's pool threads (set_threads), each row as on one thread.
"""
from __future__ import annotations

import ctypes
import functools
import math
import mmap
from collections.abc import Sequence

import numpy as np

from hetspec.workers.common.block_layouts import Unsupported, row_tiles
from hetspec.workers.common.file_embedding import FileEmbedding
from hetspec.workers.common.native_weights import FORMATS, HsMat, HsModel, Weights, describe
from hetspec.workers.common.rope_order import ROPE_NEOX, ROPE_NORM, to_llama_order
from hetspec.workers.kernels.build import KernelUnavailable, built, isa, kernel_source
from hetspec.workers.kernels.formats import BLOCK, ROW_TILED
from hetspec.workers.kernels.gguf_tensors import read_gguf

# The model, and its window products for each instruction set (window.h): one library.
SOURCES = [kernel_source(name) for name in ("native_model.c", "window_avx512.c", "window_avx2.c")]
# Feeds of this many tokens or more fill the cache through the window products. Shorter
# ones (a round's correction and bonus token) keep the one-token step: a SmolLM2 draft
# whose prompt went through windows agreed with its float32 model at 98.5% of
# positions, against 100% stepped (e7e822d:docs/kernels.md, "Filling the cache").
WINDOW_FILL = 8


class NativeModel:
    def __init__(self, path: str, n_ctx: int, cache_root: str = "", fast_head: bool = True,
                 exact_kquants: bool = False, window_layout: bool = False, four_bit: bool = False,
                 vocab: int = 0, tiles: bool = False):
        """KernelUnavailable when the C files cannot be built here, Unsupported when the file
        is not of an architecture (native_weights.ARCHITECTURES) and block types it reads.
        fast_head: read a Q8_0 output layer mostly in a Q4_1 copy (see head() in
        native_model.c); False reads all of it. exact_kquants: every weight at its exact
        value (native_weights.EXACT_LAYOUTS) rather than rounded to Q8_0. window_layout: Q4_1,
        Q8_0, Q4_K and Q6_K in the 8-bit window products' row tiles (FMT_T*) where a matrix's
        rows make whole tiles, else, with AVX-512 VNNI, in FMT_W8, FMT_N4, FMT_N6; only the
        window products read these layouts. four_bit: a draft's layers in 4 bits (Q4_1), about half the
        bytes a step reads ([draft] weights = "q4_1"). vocab > 0: a draft's steps score
        only the first `vocab` token ids, the others' logits -inf ([draft] vocab): its
        output layer's copy holds those rows alone (needs fast_head). tiles: a draft's layers'
        Q4_1 in row tiles (FMT_T4_1); its steps read them through the window products
        (activations in 8 bits), which spend fewer instructions a weight than the
        one-token kernels."""
        self._lib = load_library(cache_root)
        meta, tensors = read_gguf(path)
        self._arrays = []                            # what the C side reads: keep alive
        formats: dict[str, int] = {}
        pairs = self._lib.hs_pair_layout() == 1
        weights = Weights(self._lib, tensors, self._arrays, formats, exact_kquants, window_layout, four_bit,
                          tiles, window_layout and pairs)
        self.max_window = self._lib.hs_max_window()
        self._embedding = FileEmbedding.of(tensors, self.max_window)
        model, self._layers = describe(meta, weights, n_ctx, self._embedding)
        if self._embedding is not None:
            self._embedding.drop_pages()
        self._rope = ROPE_NEOX if model.neox_rope else ROPE_NORM
        self._allocate(model, n_ctx)
        self.n_vocab, self.n_ctx = model.n_vocab, n_ctx
        self.n_cached = 0
        self.threads = 1                             # set_threads: the products' width
        self.isa = self._lib.hs_isa().decode()
        self.description = f"native ({self.isa}), " + ", ".join(f"{n} {kind}" for kind, n in sorted(formats.items()))
        if self._embedding is not None:
            self.description += ", token embeddings read from the file's blocks"
        if weights.tiles:
            self.description += ", Q4_1 layers in row tiles (activations in 8 bits)"
        rows = min(vocab, model.n_vocab) if vocab > 0 else model.n_vocab
        if rows < model.n_vocab and not (fast_head and model.out.fmt == FORMATS["Q8_0"]):
            raise Unsupported("a draft vocabulary cut short ([draft] vocab) needs a Q8_0 output layer "
                              "read in its Q4_1 copy")
        if fast_head and model.out.fmt == FORMATS["Q8_0"]:
            model.out_fast = self._q4_1_copy(model.out, rows, weights.tiles)
            self.description += (f", output layer read in a Q4_1 copy, its {self._lib.hs_refined_logits()} "
                                 "largest logits in Q8_0")
            if rows < model.n_vocab:
                self.description += f", the first {rows} of {model.n_vocab} tokens scored"

    def _allocate(self, model: HsModel, n_ctx: int) -> None:
        """The KV cache, the C side's scratch and the buffers a forward reuses."""
        # Keys in blocks of key_block positions, dimension-major (native_model.c, attend).
        self._key_block = self._lib.hs_key_block()
        blocks = -(-n_ctx // self._key_block)
        self._kcache = lazy_zeros((model.n_layer, model.n_kv, blocks, model.head_dim, self._key_block), np.float16)
        self._vcache = lazy_zeros((model.n_layer, model.n_kv, n_ctx, model.head_dim), np.float16)
        model.kcache, model.vcache = self._kcache.ctypes.data, self._vcache.ctypes.data
        self._caches = [(self._kcache, self._vcache)]   # cache(i): the first is the one made here
        self._work = np.zeros(self._lib.hs_window_work_floats(ctypes.byref(model), self.max_window), np.float32)
        model.work = self._work.ctypes.data
        self._window_tokens = np.zeros(self.max_window, np.int32)
        self._window_norms = np.zeros((self.max_window, model.n_embd), np.float32)
        self._logits = np.zeros(model.n_vocab, np.float32)
        self._model = model

    def _q4_1_copy(self, out: HsMat, rows: int, tiles: bool) -> HsMat:
        """A Q4_1 copy of the first `rows` rows of a Q8_0 matrix (in row tiles where `tiles`)."""
        blocks = rows * (out.cols // BLOCK)
        qs, d, m = np.empty((blocks, 16), np.uint8), np.empty(blocks, np.uint16), np.empty(blocks, np.uint16)
        self._lib.hs_q4_1_from_q8_0(out.qs, out.d, blocks, qs.ctypes.data, d.ctypes.data, m.ctypes.data)
        tiled = tiles and rows % 16 == 0
        if tiled:
            qs, d, m = row_tiles(qs.reshape(rows, -1, 16), d.reshape(rows, -1), m.reshape(rows, -1))
        self._arrays.extend((qs, d, m))
        return HsMat(qs.ctypes.data, d.ctypes.data, m.ctypes.data, ROW_TILED["Q4_1"] if tiled else FORMATS["Q4_1"],
                     rows, out.cols)

    def forward(self, tokens: Sequence[int], pos: int, halt: np.ndarray | None = None) -> np.ndarray | None:
        """Evaluate `tokens` at positions pos..; the logits after the last one
        (a buffer reused by the next call). Positions from pos on are replaced.
        halt: an int32 (shared memory: the draft's extension) that stops the one-token
        steps between layers once it is not 0; then None, the positions from the
        halted token's on not cached (n_cached)."""
        ids = self._checked(tokens, pos)
        filled = ids.size - 1 if ids.size >= WINDOW_FILL else 0     # tokens through the window products
        for start in range(0, filled, self.max_window):
            n = min(self.max_window, filled - start)
            self._window_tokens[:n] = ids[start:start + n]
            self.forward_window(self._window_tokens[:n], pos + start, self._window_norms)
        self._model.halt = None if halt is None else halt.ctypes.data
        try:
            for i in range(filled, ids.size):
                logits = self._logits.ctypes.data if i == ids.size - 1 else None
                token = int(ids[i]) if self._embedding is None else int(self._embedding.rows(ids[i:i + 1])[0])
                if self._lib.hs_forward(ctypes.byref(self._model), token, pos + i, logits) != 0:
                    self.n_cached = pos + i
                    return None
        finally:
            self._model.halt = None
        self.n_cached = pos + ids.size
        return self._logits

    def _checked(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        """The tokens as int64, where they can be run at pos (ValueError says why not)."""
        if self._arrays is None:
            raise RuntimeError("NativeModel is closed")
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("forward() needs at least one token")
        if pos < 0 or pos + ids.size > self.n_ctx:
            raise ValueError(f"positions {pos}..{pos + ids.size - 1} do not fit in n_ctx={self.n_ctx}")
        if pos > self.n_cached:
            raise ValueError(f"pos={pos} but only positions 0..{self.n_cached - 1} are cached")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"token ids must be in [0, {self.n_vocab}), got min={ids.min()} max={ids.max()}")
        return ids

    def forward_window(self, tokens: np.ndarray, pos: int, norms: np.ndarray) -> None:
        """Run up to max_window int32 `tokens` at positions pos.. through the window
        products; each token's state after the final norm into norms' rows."""
        if self._embedding is not None:
            tokens = self._embedding.rows(tokens)
        if self._lib.hs_forward_window(ctypes.byref(self._model), tokens.ctypes.data, tokens.size, pos,
                                       norms.ctypes.data) != 0:
            raise RuntimeError(f"the native forward refused positions {pos}..{pos + tokens.size - 1}")

    def forward_batch(self, tokens: np.ndarray, positions: np.ndarray, kcaches: np.ndarray, vcaches: np.ndarray,
                      norms: np.ndarray) -> None:
        """Run up to max_window int32 tokens in one pass, token t at positions[t] of the cache
        whose keys and values are at addresses kcaches[t], vcaches[t] (uint64 arrays): several
        requests' windows, each in its own cache; the norms as forward_window gives them."""
        if self._embedding is not None:
            tokens = self._embedding.rows(tokens)
        if self._lib.hs_forward_batch(ctypes.byref(self._model), tokens.ctypes.data, tokens.size,
                                      positions.ctypes.data, kcaches.ctypes.data, vcaches.ctypes.data,
                                      norms.ctypes.data) != 0:
            raise RuntimeError(f"the native forward refused a batch at positions {positions.tolist()}")

    def forward_rows(self, tokens: np.ndarray, positions: np.ndarray, kcaches: np.ndarray, vcaches: np.ndarray,
                     wanted: np.ndarray) -> np.ndarray:
        """forward_batch over any number of tokens, in passes of up to max_window: the norms
        of the tokens where the bool mask `wanted` is set, (wanted.sum(), n_embd)."""
        norms, filled = np.empty((int(wanted.sum()), self.n_embd), np.float32), 0
        for start in range(0, tokens.size, self.max_window):
            part = slice(start, min(start + self.max_window, tokens.size))
            self.forward_batch(tokens[part], positions[part], kcaches[part], vcaches[part], self._window_norms)
            kept = self._window_norms[:part.stop - start][wanted[part]]
            norms[filled:filled + len(kept)] = kept
            filled += len(kept)
        return norms

    def new_cache(self) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values for another cache shaped as the model's own (forward_batch's), zero,
        its pages taken only as a request fills them (lazy_zeros)."""
        return lazy_zeros(self._kcache.shape, self._kcache.dtype), lazy_zeros(self._vcache.shape, self._vcache.dtype)

    def cache(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Cache i's keys and values (0: the model's own; the others made as first asked)."""
        while len(self._caches) <= i:
            self._caches.append(self.new_cache())
        return self._caches[i]

    def use_cache(self, i: int, n_cached: int) -> None:
        """Steps, windows and import_kv read and write cache i from now on; it holds n_cached positions."""
        self._kcache, self._vcache = self.cache(i)
        self._model.kcache, self._model.vcache = self._kcache.ctypes.data, self._vcache.ctypes.data
        self.n_cached = n_cached

    def window_logits(self, norms: np.ndarray) -> np.ndarray:
        """The logits of final-norm rows (forward_batch's), through the whole output layer
        with the window products: (rows, n_vocab) float32."""
        norms = np.ascontiguousarray(norms, np.float32)
        logits = np.empty((len(norms), self.n_vocab), np.float32)
        for start in range(0, len(norms), self.max_window):
            n = min(self.max_window, len(norms) - start)
            self._lib.hs_window_logits(ctypes.byref(self._model), norms[start:].ctypes.data, n,
                                       logits[start:].ctypes.data)
        return logits

    @property
    def n_embd(self) -> int:
        return self._model.n_embd

    def kv_geometry(self) -> list[int]:
        """[layers, kv_heads, head_dim, full-attention layers]."""
        m = self._model
        return [m.n_layer, m.n_kv, m.head_dim, sum(not layer.sliding for layer in self._layers)]

    def import_kv(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Positions 0..T-1 from (layers, kv_heads, T, head_dim) float16 keys (post-RoPE,
        transformers' order) and values, the full-attention layers first, then the
        sliding ones (as KVModel.layer_kv hands them over); see rope_order.to_llama_order."""
        layers, heads, t, d = keys.shape
        if [layers, heads, d] != self.kv_geometry()[:3] or values.shape != keys.shape or t > self.n_ctx:
            raise ValueError(f"KV of shape {keys.shape} does not fit this draft's cache {self.kv_geometry()}")
        keys = to_llama_order(keys, self._rope)
        order = sorted(range(layers), key=lambda i: bool(self._layers[i].sliding))
        block = self._key_block
        full, rest = divmod(t, block)          # whole blocks of keys, and positions in a last one
        blocked = keys[:, :, :full * block].reshape(layers, heads, full, block, d).transpose(0, 1, 2, 4, 3)
        for j, layer in enumerate(order):
            self._kcache[layer, :, :full] = blocked[j]
            if rest:
                self._kcache[layer, :, full, :, :rest] = keys[j, :, full * block:].transpose(0, 2, 1)
            self._vcache[layer, :, :t] = values[j]
        self.n_cached = t

    def set_threads(self, n_threads: int) -> int:
        """Split every product's rows (a step's and a window's) n_threads ways, each row
        computed as on one thread (pool.h); returns the width now (fewer where threads
        could not be made). The pool is the process's: one model a process sets it."""
        self.threads = self._lib.hs_set_threads(n_threads)
        return self.threads

    def thread_ids(self) -> list[int]:
        """The kernel ids of the threads that share the products with the caller's, for pinning."""
        tids = np.zeros(64, np.int32)
        return tids[:self._lib.hs_thread_ids(tids.ctypes.data)].tolist()

    def rest(self) -> None:
        """The pool's threads sleep now rather than spin until the next product (a command's
        work is done: the engine's other processes need the cores)."""
        self._lib.hs_pool_rest()

    def close(self) -> None:
        self._arrays = None


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zero array whose memory is taken a small page at a time, as it is first written.
    A KV cache is one region per layer and head, and a request fills the start of each:
    in huge pages (numpy asks for them on large arrays) a fresh cache's first pass would
    take and clear 2 MB a region, several times the pass itself (e7e822d:docs/performance.md,
    "A cache's first pass")."""
    count = math.prod(shape)
    memory = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize))   # anonymous: zero, untouched
    if hasattr(mmap, "MADV_NOHUGEPAGE"):             # (where the kernel makes huge pages unasked)
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype, count).reshape(shape)


def load_library(cache_root: str = ""):
    """native_model.c and its window products for HETSPEC_ISA's instruction set, built here
    once (KernelUnavailable where they cannot be), and loaded once per process and
    instruction set: without a cache folder each load built them anew (seconds)."""
    return _load_library(cache_root, isa())



@functools.cache
def _load_library(cache_root: str, instruction_set: str):
    with built(SOURCES, "native model kernels", cache_root) as library:
        return declare(ctypes.CDLL(library))


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The C functions' signatures, where ctypes' default (int arguments and result) is not theirs."""
    model, pointer = ctypes.POINTER(HsModel), ctypes.c_void_p
    signatures = {
        "hs_forward": (ctypes.c_int, [model, ctypes.c_int, ctypes.c_int, pointer]),
        "hs_forward_window": (ctypes.c_int, [model, pointer, ctypes.c_int, ctypes.c_int, pointer]),
        "hs_forward_batch": (ctypes.c_int, [model, pointer, ctypes.c_int, pointer, pointer, pointer, pointer]),
        "hs_window_work_floats": (ctypes.c_long, [model, ctypes.c_int]),
        "hs_window_logits": (None, [model, pointer, ctypes.c_int, pointer]),
        "hs_q4_1_from_q8_0": (None, [pointer, pointer, ctypes.c_long, pointer, pointer, pointer]),
        "hs_pack_q4_k": (None, [pointer, ctypes.c_long, pointer, pointer, pointer]),
        "hs_pack_q6_k": (None, [pointer, ctypes.c_long, pointer, pointer, pointer]),
        "hs_set_threads": (ctypes.c_int, [ctypes.c_int]),
        "hs_thread_ids": (ctypes.c_int, [pointer]),
        "hs_pool_rest": (None, []),
        "hs_isa": (ctypes.c_char_p, []),
    }
    for name, (result, arguments) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = result, arguments
    return lib


__all__ = ["KernelUnavailable", "NativeModel", "Unsupported"]
