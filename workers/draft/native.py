"""The native draft: a Llama-, Qwen2-, Qwen3- or Gemma-3-architecture GGUF model run
by workers/kernels/native_draft.c.

It reads the file's own Q8_0/Q4_0/Q4_1 blocks, and holds other block types
(Q5_0, Q5_1, the K-quants) as Q8_0: exactly for Q5_0, to within half a step of an
8-bit grid for the others; a Q8_0 output layer is read mostly in a Q4_1 copy made
at load (head() in the C file). Behind the DraftModel protocol of
workers/draft/models.py (forward, kv_geometry, import_kv), so the drafter and the
KV handover work with any backend. A token takes the one-token step, activations
rounded to 16 bits. A long feed (a prompt, a catch-up after the draft rested)
fills the cache, all but its last token, through the window products
(hs_forward_window), which read each block of weights once for a window of
tokens: about 3x faster a token, but their 8-bit activations move the cache
further from the float model's (see WINDOW_FILL). Its cache is positional: a
forward at `pos` simply overwrites from there, which is all a rollback needs.
The native target (workers/target/native_target.py) loads its model here too,
with exact_kquants: K-quants and Q5_1 then keep their exact values (Q4_K, Q6_K and
Q5_0 at their own size, FMT_K4, FMT_K6 and FMT_Q5, where the window products read
them; else int8, FMT_I8), and with window_layout its Q8_0 values are laid out for AVX-512's
window products (FMT_W8).
"""
from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hetspec.workers.draft.block_layouts import Unsupported, as_i8, as_k, as_q5, as_q8_0, window_int8
from hetspec.workers.draft.llama_kv_state import ROPE_NEOX, ROPE_NORM, to_llama_order
from hetspec.workers.kernels.build import KernelUnavailable, built, kernel_source
from hetspec.workers.kernels.formats import (
    BLOCK,
    EXPANDED_FORMAT,
    FLOAT_FORMATS,
    K_FORMATS,
    KERNEL_FORMATS,
    Q5_FORMAT,
    WINDOW_INT8,
)
from hetspec.workers.kernels.gguf_tensors import read_gguf

SOURCE = kernel_source("native_draft.c")
FORMATS = {name: fmt.code for name, fmt in KERNEL_FORMATS.items()}   # name -> the C side's FMT_* code
# Feeds of this many tokens or more fill the cache through the window products. Shorter
# ones (a round's correction and bonus token) keep the one-token step: a SmolLM2 draft
# whose prompt went through windows agreed with its float32 model at 98.5% of
# positions, against 100% stepped (docs/kernels.md, "Filling the cache").
WINDOW_FILL = 8
LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
QK_NORMS = {"q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
POST_NORMS = {"post_attn_norm": "post_attention_norm", "post_ffn_norm": "post_ffw_norm"}
BIASES = {"bq": "attn_q", "bk": "attn_k", "bv": "attn_v"}
GEMMA3_GLOBAL_EVERY = 6          # every sixth layer attends fully, the others to a window (as llama.cpp)
GEMMA3_LOCAL_ROPE_BASE = 10000.0  # the sliding layers' rope base, which Gemma 3 files do not record


class Architecture(NamedTuple):
    """How an architecture's layer differs from Llama's (native_draft.c's header says each)."""
    neox_rope: bool = False     # rope over the heads' two halves, not adjacent pairs
    qkv_bias: bool = False      # biases on query, key and value
    qk_norm: bool = False       # query and key heads RMS-normalised before rope
    gemma: bool = False         # Gemma 3's: scaled embedding, post norms, GELU, sliding-window layers


# The GGUF architectures the native kernels run (general.architecture). Mistral files are "llama".
ARCHITECTURES = {
    "llama": Architecture(),
    "qwen2": Architecture(neox_rope=True, qkv_bias=True),
    "qwen3": Architecture(neox_rope=True, qk_norm=True),
    "gemma3": Architecture(neox_rope=True, qk_norm=True, gemma=True),
}


class _Mat(ctypes.Structure):
    _fields_ = [("qs", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("fmt", ctypes.c_int), ("rows", ctypes.c_int), ("cols", ctypes.c_int),
                ("scales", ctypes.c_void_p), ("offsets", ctypes.c_void_p), ("sub", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [(name, _Mat) for name in ("wq", "wk", "wv", "wo", "gate", "up", "down")] + [
        (name, ctypes.c_void_p) for name in ("attn_norm", "ffn_norm", *QK_NORMS, *POST_NORMS)] + [
        ("sliding", ctypes.c_int)] + [(name, ctypes.c_void_p) for name in BIASES]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in
                ("n_layer", "n_embd", "n_head", "n_kv", "head_dim", "n_ff", "n_vocab", "n_ctx")] + [
        ("eps", ctypes.c_float), ("rope_base", ctypes.c_float), ("embd", _Mat), ("out", _Mat),
        ("out_norm", ctypes.c_void_p), ("layers", ctypes.POINTER(_Layer)),
        ("kcache", ctypes.c_void_p), ("vcache", ctypes.c_void_p), ("work", ctypes.c_void_p),
        ("neox_rope", ctypes.c_int), ("gelu", ctypes.c_int), ("window", ctypes.c_int),
        ("embd_scale", ctypes.c_float), ("rope_base_local", ctypes.c_float), ("out_fast", _Mat),
        ("rope_freqs", ctypes.c_void_p), ("rope_scale", ctypes.c_float)]


class NativeDraftModel:
    def __init__(self, path: str, n_ctx: int, cache_root: str = "", fast_head: bool = True,
                 exact_kquants: bool = False, window_layout: bool = False):
        """KernelUnavailable when the C file cannot be built here, Unsupported
        when the file is not of an architecture (ARCHITECTURES) and block types it reads.
        fast_head: read a Q8_0 output layer mostly in a Q4_1 copy (see head()
        in native_draft.c); False reads all of it. exact_kquants: K-quant blocks
        as their exact values (FMT_I8, more bytes) rather than rounded to Q8_0.
        window_layout: Q8_0 values laid out for the target's 8-bit window products
        (FMT_W8), where the CPU has them; only hs_forward_window reads that layout."""
        self._lib = load_library(cache_root)
        meta, tensors = read_gguf(path)
        self._arrays = []                            # what the C side reads: keep alive
        formats: dict[str, int] = {}
        window_layout = window_layout and self._lib.hs_pair_layout() == 1
        weights = _Weights(self._lib, tensors, self._arrays, formats, exact_kquants, window_layout)
        self._embedding = FileEmbedding.of(tensors, self._lib.hs_max_window())
        model, self._layers = _describe(meta, weights, n_ctx, self._embedding)
        if self._embedding is not None:
            self._embedding.drop_pages()
        self._rope = ROPE_NEOX if model.neox_rope else ROPE_NORM
        # Keys in blocks of key_block positions, dimension-major (native_draft.c, attend).
        self._key_block = self._lib.hs_key_block()
        blocks = -(-n_ctx // self._key_block)
        self._kcache = np.zeros((model.n_layer, model.n_kv, blocks, model.head_dim, self._key_block), np.float16)
        self._vcache = np.zeros((model.n_layer, model.n_kv, n_ctx, model.head_dim), np.float16)
        model.kcache, model.vcache = self._kcache.ctypes.data, self._vcache.ctypes.data
        self._lib.hs_work_floats.restype = ctypes.c_long
        self._lib.hs_work_floats.argtypes = [ctypes.POINTER(_Model)]
        self._lib.hs_forward.restype = ctypes.c_int
        self._lib.hs_forward.argtypes = [ctypes.POINTER(_Model), ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self._lib.hs_q4_1_from_q8_0.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_long] + [ctypes.c_void_p] * 3
        self._lib.hs_max_window.restype = ctypes.c_int
        self._lib.hs_window_work_floats.restype = ctypes.c_long
        self._lib.hs_window_work_floats.argtypes = [ctypes.POINTER(_Model), ctypes.c_int]
        self._lib.hs_forward_window.restype = ctypes.c_int
        self._lib.hs_forward_window.argtypes = [ctypes.POINTER(_Model), ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                                ctypes.c_void_p]
        self.max_window = self._lib.hs_max_window()
        self._window_tokens = np.zeros(self.max_window, np.int32)
        self._window_norms = np.zeros((self.max_window, model.n_embd), np.float32)
        self._work = np.zeros(max(self._lib.hs_work_floats(ctypes.byref(model)),
                                  self._lib.hs_window_work_floats(ctypes.byref(model), self.max_window)), np.float32)
        model.work = self._work.ctypes.data
        self._model = model
        self._logits = np.zeros(model.n_vocab, np.float32)
        self.n_vocab, self.n_ctx = model.n_vocab, n_ctx
        self.n_cached = 0
        self.description = "native, " + ", ".join(f"{n} {kind}" for kind, n in sorted(formats.items()))
        if self._embedding is not None:
            self.description += ", token embeddings read from the file's blocks"
        if fast_head and model.out.fmt == FORMATS["Q8_0"]:
            model.out_fast = self._q4_1_copy(model.out)
            self.description += (f", output layer read in a Q4_1 copy, its {self._lib.hs_refined_logits()} "
                                 "largest logits in Q8_0")

    def _q4_1_copy(self, out: _Mat) -> _Mat:
        blocks = out.rows * (out.cols // BLOCK)
        qs, d, m = np.empty((blocks, 16), np.uint8), np.empty(blocks, np.uint16), np.empty(blocks, np.uint16)
        self._lib.hs_q4_1_from_q8_0(out.qs, out.d, blocks, qs.ctypes.data, d.ctypes.data, m.ctypes.data)
        self._arrays.extend((qs, d, m))
        return _Mat(qs.ctypes.data, d.ctypes.data, m.ctypes.data, FORMATS["Q4_1"], out.rows, out.cols)

    def forward(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        """Evaluate `tokens` at positions pos..; the logits after the last one
        (a buffer reused by the next call). Positions from pos on are replaced."""
        if self._arrays is None:
            raise RuntimeError("NativeDraftModel is closed")
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("forward() needs at least one token")
        if pos < 0 or pos + ids.size > self.n_ctx:
            raise ValueError(f"positions {pos}..{pos + ids.size - 1} do not fit in n_ctx={self.n_ctx}")
        if pos > self.n_cached:
            raise ValueError(f"pos={pos} but only positions 0..{self.n_cached - 1} are cached")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError(f"token ids must be in [0, {self.n_vocab}), got min={ids.min()} max={ids.max()}")
        filled = ids.size - 1 if ids.size >= WINDOW_FILL else 0     # tokens through the window products
        for start in range(0, filled, self.max_window):
            n = min(self.max_window, filled - start)
            self._window_tokens[:n] = ids[start:start + n]
            self.forward_window(self._window_tokens[:n], pos + start, self._window_norms)
        for i in range(filled, ids.size):
            logits = self._logits.ctypes.data if i == ids.size - 1 else None
            token = int(ids[i]) if self._embedding is None else int(self._embedding.rows(ids[i:i + 1])[0])
            self._lib.hs_forward(ctypes.byref(self._model), token, pos + i, logits)
        self.n_cached = pos + ids.size
        return self._logits

    def forward_window(self, tokens: np.ndarray, pos: int, norms: np.ndarray) -> None:
        """Run up to max_window int32 `tokens` at positions pos.. through the window
        products; each token's state after the final norm into norms' rows."""
        if self._embedding is not None:
            tokens = self._embedding.rows(tokens)
        if self._lib.hs_forward_window(ctypes.byref(self._model), tokens.ctypes.data, tokens.size, pos,
                                       norms.ctypes.data) != 0:
            raise RuntimeError(f"the native forward refused positions {pos}..{pos + tokens.size - 1}")

    def kv_geometry(self) -> list[int]:
        """[layers, kv_heads, head_dim, full-attention layers]."""
        m = self._model
        return [m.n_layer, m.n_kv, m.head_dim, sum(not layer.sliding for layer in self._layers)]

    def import_kv(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Positions 0..T-1 from (layers, kv_heads, T, head_dim) float16 keys (post-RoPE,
        transformers' order) and values, the full-attention layers first, then the
        sliding ones (as KVModel.layer_kv hands them over); see llama_kv_state.to_llama_order."""
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

    def set_threads(self, n_threads: int) -> None:
        """One thread only: a draft step is too short to split."""

    def close(self) -> None:
        self._arrays = None


@functools.cache
def load_library(cache_root: str = ""):
    """native_draft.c, built here once (KernelUnavailable where it cannot be), and loaded
    once per process: without a cache folder each load built it anew (seconds)."""
    with built(SOURCE, "native draft kernels", cache_root) as library:
        lib = ctypes.CDLL(library)
    for pack in (lib.hs_pack_q4_k, lib.hs_pack_q6_k):
        pack.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        pack.restype = None
    return lib


class _Weights(NamedTuple):
    """How a file's tensors become the C side's: what reads them, what keeps them alive."""
    lib: ctypes.CDLL          # native_draft.c, which lays K-quants out (hs_pack_q4_k, hs_pack_q6_k)
    tensors: dict             # the file's, by name (gguf_tensors.read_gguf)
    keep: list                # the arrays the C side reads: held as long as the model
    formats: dict             # matrices counted by how they are held, for the description
    exact: bool               # K-quants, Q5_0 and Q5_1 at their exact values (see _mat)
    window: bool              # Q8_0 laid out for AVX-512's window products (FMT_W8)


class FileEmbedding:
    """Token embeddings dequantized from the file's own blocks, a row per token as it
    comes (gguf's dequantize, as llama.cpp's get_rows reads them), into rows the C side
    reads as its embedding table (FMT_F32), the tokens renumbered to those rows. Only
    where the output layer is a tensor of its own: nothing else reads the table, so a
    converted copy of it would be memory for one row a token (docs/kernels.md)."""

    def __init__(self, tensor, rows: int):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        self.data = tensor.data
        self.dequantize = functools.partial(dequantize, qtype=GGMLQuantizationType[tensor.type_name])
        self.buffer = np.zeros((rows, tensor.shape[0]), np.float32)
        self.local = np.arange(rows, dtype=np.int32)

    @classmethod
    def of(cls, tensors: dict, rows: int) -> FileEmbedding | None:
        embedding = tensors.get("token_embd.weight")
        if "output.weight" not in tensors or embedding is None or not embedding.type_name or embedding.data is None:
            return None
        return cls(embedding, rows)

    def drop_pages(self) -> None:
        """Loading read every block through the file's memory map, which the rows keep
        open: without this all of them would count as resident. They stay in the page
        cache; a row read again comes back from there."""
        mapping = getattr(self.data, "_mmap", None)
        if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapping.madvise(mmap.MADV_DONTNEED)

    def mat(self) -> _Mat:
        return _Mat(self.buffer.ctypes.data, None, None, FLOAT_FORMATS["F32"], len(self.buffer), self.buffer.shape[1])

    def rows(self, tokens) -> np.ndarray:
        """Fills a row per token (at most len(buffer)); returns the tokens' row numbers."""
        self.buffer[:len(tokens)] = self.dequantize(self.data[np.asarray(tokens, np.int64)])
        return self.local[:len(tokens)]


def _describe(meta: dict, w: _Weights, n_ctx: int, embedding: FileEmbedding | None = None):
    """The C side's model: its shape from the file's metadata, its matrices and norms
    from its tensors; the token embeddings from `embedding`'s rows where given."""
    model, arch = _shape(meta, n_ctx)
    model.embd = _mat(w, "token_embd.weight") if embedding is None else embedding.mat()
    model.out = _mat(w, "output.weight") if "output.weight" in w.tensors else model.embd
    model.n_vocab = model.out.rows
    model.out_norm = _vector(w, "output_norm.weight", model.n_embd)
    if "rope_freqs.weight" in w.tensors:        # Llama 3's rope scaling
        model.rope_freqs = _vector(w, "rope_freqs.weight", model.head_dim // 2)
    layers = (_Layer * model.n_layer)()
    for i, layer in enumerate(layers):
        _fill_layer(layer, i, model, arch, w)
    _check_shapes(model, layers)
    model.layers = layers
    return model, layers


def _shape(meta: dict, n_ctx: int) -> tuple[_Model, Architecture]:
    """(the model's dimensions and settings, its architecture); Unsupported names what
    the native kernels cannot run."""
    name = meta.get("general.architecture")
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise Unsupported(f"the native kernels run {', '.join(ARCHITECTURES)} files, not {name!r}")

    def number(key: str, default=None):
        value = meta.get(f"{name}.{key}", default)
        if value is None:
            raise Unsupported(f"the file has no {name}.{key}")
        return value

    n_embd, n_head = number("embedding_length"), number("attention.head_count")
    head_dim = number("attention.key_length", n_embd // n_head)
    if number("attention.value_length", head_dim) != head_dim:
        raise Unsupported("the native kernels need keys and values of one head size")
    if number("rope.dimension_count", head_dim) != head_dim:
        raise Unsupported("the native kernels need rope over whole heads")
    model = _Model(n_layer=number("block_count"), n_embd=n_embd, n_head=n_head,
                   n_kv=number("attention.head_count_kv", n_head), head_dim=head_dim,
                   n_ff=number("feed_forward_length"), n_ctx=n_ctx,
                   eps=number("attention.layer_norm_rms_epsilon"), rope_base=number("rope.freq_base", 10000.0),
                   neox_rope=int(arch.neox_rope), gelu=int(arch.gemma),
                   window=number("attention.sliding_window") if arch.gemma else 0,
                   embd_scale=float(np.sqrt(np.float32(n_embd))) if arch.gemma else 1.0,
                   rope_scale=_rope_scale(meta, name))
    model.rope_base_local = GEMMA3_LOCAL_ROPE_BASE if arch.gemma else model.rope_base
    if head_dim % 8 or head_dim > 256 or n_embd % BLOCK or model.n_ff % BLOCK or n_head % model.n_kv:
        raise Unsupported(f"the native kernels cannot run heads of {head_dim} or widths {n_embd}/{model.n_ff}")
    return model, arch


def _rope_scale(meta: dict, arch: str) -> float:
    """What the rope's angles are multiplied by: 1, or 1 / factor for linear scaling."""
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
    if kind == "none" or factor == 1.0:
        return 1.0
    if kind == "linear":
        return 1.0 / factor
    raise Unsupported(f"the native kernels do not run {kind!r} rope scaling")


def _fill_layer(layer: _Layer, i: int, model: _Model, arch: Architecture, w: _Weights) -> None:
    for field, name in zip(("wq", "wk", "wv", "wo", "gate", "up", "down"), LAYER_MATRICES):
        setattr(layer, field, _mat(w, f"blk.{i}.{name}.weight"))
    layer.attn_norm = _vector(w, f"blk.{i}.attn_norm.weight", model.n_embd)
    layer.ffn_norm = _vector(w, f"blk.{i}.ffn_norm.weight", model.n_embd)
    if arch.qk_norm:
        for field, name in QK_NORMS.items():
            setattr(layer, field, _vector(w, f"blk.{i}.{name}.weight", model.head_dim))
    if arch.qkv_bias:
        widths = {"bq": model.n_head * model.head_dim, "bk": model.n_kv * model.head_dim,
                  "bv": model.n_kv * model.head_dim}
        for field, name in BIASES.items():
            setattr(layer, field, _vector(w, f"blk.{i}.{name}.bias", widths[field]))
    if arch.gemma:
        for field, name in POST_NORMS.items():
            setattr(layer, field, _vector(w, f"blk.{i}.{name}.weight", model.n_embd))
        layer.sliding = int((i + 1) % GEMMA3_GLOBAL_EVERY != 0)


def _check_shapes(model: _Model, layers) -> None:
    n_embd, q_dim, kv_dim = model.n_embd, model.n_head * model.head_dim, model.n_kv * model.head_dim
    shapes = {"wq": (q_dim, n_embd), "wk": (kv_dim, n_embd), "wv": (kv_dim, n_embd), "wo": (n_embd, q_dim),
              "gate": (model.n_ff, n_embd), "up": (model.n_ff, n_embd), "down": (n_embd, model.n_ff)}
    for field, (rows, cols) in shapes.items():
        mat = getattr(layers[0], field)
        if (mat.rows, mat.cols) != (rows, cols):
            raise Unsupported(f"blk.0 {field} is {mat.rows} x {mat.cols}, not the {rows} x {cols} of a layer")
    if model.embd.cols != n_embd or model.out.cols != n_embd or model.out.rows != model.n_vocab:
        raise Unsupported("the embedding and output matrices do not match the model's width and vocabulary")


def _mat(w: _Weights, name: str) -> _Mat:
    """The tensor's blocks taken apart into quants, scales and offsets (one
    array each, row by row): the kernel then reads eight blocks' scales at once.
    exact: K-quants keep their values (Q4_K, Q6_K and Q5_0 in their own layout, FMT_K4, FMT_K6
    and FMT_Q5, where the 16-bit kernels read them; else FMT_I8 or Q8_0), F16 and F32
    matrices are read as stored; else they are rounded to Q8_0.
    window: Q8_0 values in the window products' layout (FMT_W8, block_layouts.window_int8)."""
    keep, formats, exact, window = w.keep, w.formats, w.exact, w.window
    tensor = w.tensors.get(name)
    if tensor is None:
        raise Unsupported(f"the file has no tensor {name}")
    cols, rows = tensor.shape[0], int(np.prod(tensor.shape[1:]))
    fmt = tensor.type_name
    if exact and fmt not in (*FORMATS, "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", *FLOAT_FORMATS):
        raise Unsupported(f"{name} is {fmt}, which hetspec's kernels cannot hold exactly (they read Q4_0, Q4_1, "
                          "Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16 and F32)")
    if exact and fmt in FLOAT_FORMATS:        # the file's own bytes, not copied
        if cols % 16:
            raise Unsupported(f"{name} has rows of {cols} values; the float kernels take multiples of 16")
        data = np.ascontiguousarray(tensor.data)
        keep.append(data)
        formats[fmt] = formats.get(fmt, 0) + 1
        return _Mat(data.ctypes.data, None, None, FLOAT_FORMATS[fmt], rows, cols)
    if exact and not window and fmt in K_FORMATS:
        qs, sub, scales = as_k(w.lib, tensor, rows, cols)
        keep.extend((qs, sub, scales))
        formats[fmt] = formats.get(fmt, 0) + 1
        return _Mat(qs.ctypes.data, None, None, K_FORMATS[fmt], rows, cols, scales.ctypes.data, None, sub.ctypes.data)
    if exact and not window and fmt == "Q5_0":
        qs, d = as_q5(tensor, rows, cols)
        keep.extend((qs, d))
        formats[fmt] = formats.get(fmt, 0) + 1
        return _Mat(qs.ctypes.data, d.ctypes.data, None, Q5_FORMAT, rows, cols)
    if exact and fmt in ("Q5_1", "Q4_K", "Q5_K", "Q6_K"):
        q, scales, offsets = as_i8(tensor, rows, cols)
        keep.extend(a for a in (q, scales, offsets) if a is not None)
        formats[f"{fmt} exact"] = formats.get(f"{fmt} exact", 0) + 1
        return _Mat(q.ctypes.data, None, None, EXPANDED_FORMAT, rows, cols, scales.ctypes.data,
                    offsets.ctypes.data if offsets is not None else None)
    if fmt in FORMATS:
        blocks = tensor.data.reshape(rows, cols // BLOCK, -1)
        first = 4 if fmt == "Q4_1" else 2                  # d (and m) come before the quants
        parts = [blocks[:, :, first:], blocks[:, :, :2].view(np.uint16),     # views: copied once, below
                 blocks[:, :, 2:4].view(np.uint16) if fmt == "Q4_1" else None]
        formats[fmt] = formats.get(fmt, 0) + 1
    else:
        parts = [*as_q8_0(tensor, rows, cols), None]
        formats[f"Q8_0 from {fmt}"] = formats.get(f"Q8_0 from {fmt}", 0) + 1
        fmt = "Q8_0"
    if window and fmt == "Q8_0":
        qs, scales = window_int8(parts[0].reshape(rows, cols // BLOCK, BLOCK), parts[1].reshape(rows, cols // BLOCK))
        keep.extend((qs, scales))
        return _Mat(qs.ctypes.data, None, None, WINDOW_INT8, rows, cols, scales.ctypes.data, None)
    parts = [np.ascontiguousarray(p) if p is not None else None for p in parts]
    keep.extend(p for p in parts if p is not None)
    qs, d, m = (p.ctypes.data if p is not None else None for p in parts)
    return _Mat(qs, d, m, FORMATS[fmt], rows, cols)


def _vector(w: _Weights, name: str, n: int) -> int:
    """A norm's weights or a bias: n float32 values."""
    tensor = w.tensors.get(name)
    if tensor is None or tensor.type_name != "F32" or tensor.shape[0] != n:
        raise Unsupported(f"{name} must be {n} float32 values")
    w.keep.append(np.array(tensor.data).view(np.float32))
    return w.keep[-1].ctypes.data


__all__ = ["KernelUnavailable", "NativeDraftModel", "Unsupported"]
