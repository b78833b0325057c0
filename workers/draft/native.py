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
with exact_kquants: K-quants and Q5_1 then keep their exact values (Q4_K and Q6_K
at their own size, FMT_K4 and FMT_K6, where the window products read them; else
int8, FMT_I8), and with window_layout its Q8_0 values are laid out for AVX-512's
window products (FMT_W8).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hetspec.workers.draft.llama_kv_state import ROPE_NEOX, ROPE_NORM, to_llama_order
from hetspec.workers.kernels.build import KernelUnavailable, built, kernel_source
from hetspec.workers.kernels.formats import BLOCK, BY_NAME, EXPANDED_FORMAT, K_FORMATS, KERNEL_FORMATS, WINDOW_INT8
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


class Unsupported(ValueError):
    """The file is not one the native draft can run (another architecture or weight type)."""


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
        model, self._layers = _describe(meta, tensors, n_ctx, self._arrays, formats, exact_kquants, window_layout)
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
            self._lib.hs_forward(ctypes.byref(self._model), int(ids[i]), pos + i, logits)
        self.n_cached = pos + ids.size
        return self._logits

    def forward_window(self, tokens: np.ndarray, pos: int, norms: np.ndarray) -> None:
        """Run up to max_window int32 `tokens` at positions pos.. through the window
        products; each token's state after the final norm into norms' rows."""
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


def load_library(cache_root: str = ""):
    """native_draft.c, built here once (KernelUnavailable where it cannot be)."""
    with built(SOURCE, "native draft kernels", cache_root) as library:
        return ctypes.CDLL(library)


def _describe(meta: dict, tensors: dict, n_ctx: int, keep: list, formats: dict, exact: bool = False,
              window: bool = False):
    """The C side's model: its shape from the file's metadata, its matrices and norms
    from its tensors (kept alive in `keep`; their formats counted in `formats`)."""
    model, arch = _shape(meta, n_ctx)
    model.embd = _mat(tensors, "token_embd.weight", keep, formats, exact, window)
    model.out = (_mat(tensors, "output.weight", keep, formats, exact, window) if "output.weight" in tensors
                 else model.embd)
    model.n_vocab = model.embd.rows
    model.out_norm = _vector(tensors, "output_norm.weight", model.n_embd, keep)
    if "rope_freqs.weight" in tensors:        # Llama 3's rope scaling
        model.rope_freqs = _vector(tensors, "rope_freqs.weight", model.head_dim // 2, keep)
    layers = (_Layer * model.n_layer)()
    for i, layer in enumerate(layers):
        _fill_layer(layer, i, model, arch, tensors, keep, formats, exact, window)
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


def _fill_layer(layer: _Layer, i: int, model: _Model, arch: Architecture, tensors: dict, keep: list, formats: dict,
                exact: bool, window: bool) -> None:
    for field, name in zip(("wq", "wk", "wv", "wo", "gate", "up", "down"), LAYER_MATRICES):
        setattr(layer, field, _mat(tensors, f"blk.{i}.{name}.weight", keep, formats, exact, window))
    layer.attn_norm = _vector(tensors, f"blk.{i}.attn_norm.weight", model.n_embd, keep)
    layer.ffn_norm = _vector(tensors, f"blk.{i}.ffn_norm.weight", model.n_embd, keep)
    if arch.qk_norm:
        for field, name in QK_NORMS.items():
            setattr(layer, field, _vector(tensors, f"blk.{i}.{name}.weight", model.head_dim, keep))
    if arch.qkv_bias:
        widths = {"bq": model.n_head * model.head_dim, "bk": model.n_kv * model.head_dim,
                  "bv": model.n_kv * model.head_dim}
        for field, name in BIASES.items():
            setattr(layer, field, _vector(tensors, f"blk.{i}.{name}.bias", widths[field], keep))
    if arch.gemma:
        for field, name in POST_NORMS.items():
            setattr(layer, field, _vector(tensors, f"blk.{i}.{name}.weight", model.n_embd, keep))
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


def _mat(tensors: dict, name: str, keep: list, formats: dict, exact: bool = False, window: bool = False) -> _Mat:
    """The tensor's blocks taken apart into quants, scales and offsets (one
    array each, row by row): the kernel then reads eight blocks' scales at once.
    exact: K-quants keep their values (Q4_K and Q6_K in their own layout, FMT_K4 and FMT_K6,
    where the 16-bit kernels read them; else FMT_I8), else they are rounded to Q8_0.
    window: Q8_0 values in the window products' layout (FMT_W8, _window_int8)."""
    tensor = tensors.get(name)
    if tensor is None:
        raise Unsupported(f"the file has no tensor {name}")
    cols, rows = tensor.shape[0], int(np.prod(tensor.shape[1:]))
    fmt = tensor.type_name
    if exact and fmt not in (*FORMATS, "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"):
        raise Unsupported(f"{name} is {fmt}, which hetspec's kernels cannot hold exactly (they read Q4_0, Q4_1, "
                          "Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K)")
    if exact and not window and fmt in K_FORMATS:
        qs, sub, scales = _as_k(tensor, rows, cols)
        keep.extend((qs, sub, scales))
        formats[fmt] = formats.get(fmt, 0) + 1
        return _Mat(qs.ctypes.data, None, None, K_FORMATS[fmt], rows, cols, scales.ctypes.data, None, sub.ctypes.data)
    if exact and fmt in ("Q5_1", "Q4_K", "Q5_K", "Q6_K"):
        q, scales, offsets = _as_i8(tensor, rows, cols)
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
        parts = [*_as_q8_0(tensor, rows, cols), None]
        formats[f"Q8_0 from {fmt}"] = formats.get(f"Q8_0 from {fmt}", 0) + 1
        fmt = "Q8_0"
    if window and fmt == "Q8_0":
        qs, scales = _window_int8(parts[0].reshape(rows, cols // BLOCK, BLOCK), parts[1].reshape(rows, cols // BLOCK))
        keep.extend((qs, scales))
        return _Mat(qs.ctypes.data, None, None, WINDOW_INT8, rows, cols, scales.ctypes.data, None)
    parts = [np.ascontiguousarray(p) if p is not None else None for p in parts]
    keep.extend(p for p in parts if p is not None)
    qs, d, m = (p.ctypes.data if p is not None else None for p in parts)
    return _Mat(qs, d, m, FORMATS[fmt], rows, cols)


def _window_int8(q: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 quants (rows, blocks, 32) and float16 scales (rows, blocks, as uint16) as the
    window products read them (window8.h): per pair of blocks 64 bytes, block b's dwords
    in the even places and b + 1's in the odd, each quant + 128; the scales in float32.
    A last block without a partner is paired with zeros."""
    rows, nb, _ = q.shape
    pairs = (nb + 1) // 2
    biased = np.full((rows, 2 * pairs, BLOCK), 128, np.uint8)
    biased[:, :nb] = q.view(np.uint8) ^ np.uint8(0x80)
    biased = biased.reshape(rows, pairs, 2, 8, 4).transpose(0, 1, 3, 2, 4)
    scales = np.zeros((rows, 2 * pairs), np.float32)
    scales[:, :nb] = d.view(np.float16)
    return np.ascontiguousarray(biased).reshape(rows, pairs * 64), scales


def _as_q8_0(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 quants, float16 scales) of a tensor of another block type. Q5_0's
    values d * (q - 16) keep their scale and are exact; the K-quants' 16- and
    32-value sub-blocks get one scale per 32 values, max |w| / 127."""
    import gguf

    if tensor.data is None or cols % BLOCK:
        raise Unsupported(f"{tensor.name} is stored as GGML type {tensor.ggml_type}, which the native draft "
                          f"cannot read")
    try:
        kind = gguf.GGMLQuantizationType(tensor.ggml_type)
        values = gguf.quants.dequantize(np.asarray(tensor.data), kind).reshape(rows, cols // BLOCK, BLOCK)
    except (ValueError, NotImplementedError) as exc:
        raise Unsupported(f"{tensor.name}: GGML type {tensor.ggml_type} cannot be read ({exc})") from None
    if tensor.type_name == "Q5_0":
        blocks = tensor.data.reshape(rows, cols // BLOCK, BY_NAME["Q5_0"].block_bytes)
        d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[..., 0]
    else:
        d = (np.abs(values).max(axis=2) / 127).astype(np.float16)
    scale = d.astype(np.float32)
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.clip(np.rint(values * inverse[..., None]), -127, 127).astype(np.int8)
    return q.reshape(rows, cols), np.ascontiguousarray(d).view(np.uint16)


def _as_i8(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(int8 quants, float32 scale per 16 weights, float32 offset per 32 or None)
    of a Q5_1, Q4_K, Q5_K or Q6_K tensor: its exact values, laid out for the kernel.
    Q5_1: q is the 5-bit quant, the scale d, the offset m.
    scales[r, j // 16] * q[r, j] + offsets[r, j // 32] is gguf's dequantized
    weight bit for bit in float32 (d * sc, dmin * m and scale * q are exact, so
    the one add rounds as gguf's subtraction does). Q4_K/Q5_K: q is the 4/5-bit
    quant, the two 16-halves of a 32-sub-block share d * sc and the offset is
    -(dmin * m); Q6_K: q is q6 - 32, the scale d * sc, no offset."""
    from gguf.quants import Q4_K

    fmt = tensor.type_name
    if tensor.data is None or cols % BY_NAME.get(fmt, BY_NAME["F32"]).per_block or fmt not in (
            "Q5_1", "Q4_K", "Q5_K", "Q6_K"):
        raise Unsupported(f"{tensor.name} is stored as GGML type {tensor.ggml_type}, not Q5_1 or a 256-weight K-quant")
    blocks = np.asarray(tensor.data).reshape(-1, BY_NAME[fmt].block_bytes)
    n = blocks.shape[0]

    def f16(lo: int) -> np.ndarray:          # the float16 at bytes lo, lo+1 of every block, as float32 (n, 1)
        return np.ascontiguousarray(blocks[:, lo:lo + 2]).view(np.float16).astype(np.float32)

    nibbles = np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    if fmt == "Q5_1":                        # d m qh[4] qs[16]: weight j's fifth bit is bit j of qh
        q = ((blocks[:, 8:24].reshape(n, 1, 16) >> nibbles[0]) & 0x0F).reshape(n, 32)
        high = np.ascontiguousarray(blocks[:, 4:8]).view(np.uint32)
        q |= (((high >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
        return q.view(np.int8).reshape(rows, cols), np.repeat(f16(0), 2, axis=1).reshape(rows, cols // 16), \
            f16(2).reshape(rows, cols // 32)
    if fmt == "Q6_K":                        # ql[128] qh[64] scales[16] d; quants in 8 runs of 32
        low = (blocks[:, :128].reshape(n, 2, 1, 64) >> nibbles) & 0x0F
        high = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        q = (low.reshape(n, 8, 32) | (high.reshape(n, 8, 32) << 4)).view(np.int8) - np.int8(32)
        scales = f16(208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
        return q.reshape(rows, cols), scales.reshape(rows, cols // 16), None
    # Q4_K: d dmin scales[12] qs[128]; Q5_K: d dmin scales[12] qh[32] qs[128]
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
    q = ((blocks[:, -128:].reshape(n, 4, 1, 32) >> nibbles) & 0x0F).reshape(n, 8, 32)
    if fmt == "Q5_K":                        # bit j of qh[i] is the fifth bit of sub-block j's weight i
        q |= ((blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4
    scales = np.repeat(f16(0) * sc.astype(np.float32), 2, axis=1)
    offsets = -(f16(2) * m.astype(np.float32))
    return q.view(np.int8).reshape(rows, cols), scales.reshape(rows, cols // 16), offsets.reshape(rows, cols // 32)


def _as_k(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quants, integer sub-block scales, float scales) of a Q4_K or Q6_K tensor in
    FMT_K4 or FMT_K6's layout (formats.h): the file's values at the file's size.
    Per block of 32, the quants' low nibbles as Q4_0 orders them (weight j in byte
    j % 16, high nibble for j >= 16); Q6_K then 8 bytes of top bits, byte j holding
    weights j, j + 8, j + 16, j + 24. Q4_K: per 256 weights 8 scales then 8 mins,
    and d, dmin as float32; Q6_K: an int8 scale per 16 and d as float32."""
    from gguf.quants import Q4_K

    fmt = tensor.type_name
    blocks = np.asarray(tensor.data).reshape(-1, BY_NAME[fmt].block_bytes)
    n = blocks.shape[0]                       # superblocks of 256 weights

    def f16(lo: int) -> np.ndarray:           # the float16 at bytes lo, lo+1 of every superblock, as float32 (n, 1)
        return np.ascontiguousarray(blocks[:, lo:lo + 2]).view(np.float16).astype(np.float32)

    nibbles = np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    if fmt == "Q4_K":                         # d dmin scales[12] qs[128]: 4 runs of 32 bytes, low then high nibbles
        q = ((blocks[:, -128:].reshape(n, 4, 1, 32) >> nibbles) & 0x0F).reshape(n * 8, 32)
        sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        sub = np.concatenate([sc.reshape(n, 8), m.reshape(n, 8)], axis=1).astype(np.uint8)
        scales = np.concatenate([f16(0), f16(2)], axis=1)
    else:                                     # ql[128] qh[64] scales[16] d
        low = (blocks[:, :128].reshape(n, 2, 1, 64) >> nibbles) & 0x0F
        high = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        q = (low.reshape(n, 8, 32) | (high.reshape(n, 8, 32) << 4)).reshape(n * 8, 32)   # 6-bit, unsigned
        sub = blocks[:, 192:208].copy()
        scales = f16(208)
    packed = (q[:, :16] & 0x0F) | (q[:, 16:] & 0x0F) << 4
    if fmt == "Q6_K":                         # top bits: byte j, bits 2k..2k+1 = weight j + 8k's
        top = (q >> 4).reshape(n * 8, 4, 8)
        packed = np.concatenate([packed, top[:, 0] | top[:, 1] << 2 | top[:, 2] << 4 | top[:, 3] << 6], axis=1)
    return (np.ascontiguousarray(packed, np.uint8).reshape(rows, -1), np.ascontiguousarray(sub).reshape(rows, -1),
            np.ascontiguousarray(scales, np.float32).reshape(rows, -1))


def _vector(tensors: dict, name: str, n: int, keep: list) -> int:
    """A norm's weights or a bias: n float32 values."""
    tensor = tensors.get(name)
    if tensor is None or tensor.type_name != "F32" or tensor.shape[0] != n:
        raise Unsupported(f"{name} must be {n} float32 values")
    keep.append(np.array(tensor.data).view(np.float32))
    return keep[-1].ctypes.data


__all__ = ["KernelUnavailable", "NativeDraftModel", "Unsupported"]
