"""A GGUF file's tensors as the native model's C structs (hs_mat, hs_layer, hs_model in
workers/kernels/matrix.h and native_model.c), made at load.

What an architecture changes in a layer is a flag of ARCHITECTURES, each stated once,
and each matrix is held in the layout one small function makes (EXACT_LAYOUTS): a draft
reads the file's Q8_0/Q4_0/Q4_1 blocks as they are and other block types rounded to
Q8_0 (exactly for Q5_0, to within half a step of an 8-bit grid for the others); a
target (exact) keeps every value exactly: Q4_K, Q6_K and Q5_0 at their own size
(FMT_K4, FMT_K6, FMT_Q5) where its window products read them, other K-quants and Q5_1
as int8 quants with float scales (FMT_I8), F16 and F32 as the file stores them; and
with the window layout its Q4_1, Q8_0, Q4_K and Q6_K values (Q5_0's as Q8_0) in tiles of 16
rows for those products (FMT_T*), or where a matrix's rows are not whole tiles, with AVX-512,
Q8_0 in pairs of blocks (FMT_W8) and Q4_K and Q6_K in 4 and 6 bits with float scales
(FMT_N4, FMT_N6), with AVX2 as EXACT_LAYOUTS holds them.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

from hetspec.workers.common import block_layouts as layouts
from hetspec.workers.common.block_layouts import Unsupported
from hetspec.workers.kernels import formats
from hetspec.workers.kernels.formats import BLOCK

FORMATS = {name: fmt.code for name, fmt in formats.KERNEL_FORMATS.items()}   # name -> the C side's FMT_* code
LAYER_MATRICES = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output", "gate": "ffn_gate",
                  "up": "ffn_up", "down": "ffn_down"}
QK_NORMS = {"q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
POST_NORMS = {"post_attn_norm": "post_attention_norm", "post_ffn_norm": "post_ffw_norm"}
BIASES = {"bq": "attn_q", "bk": "attn_k", "bv": "attn_v"}


class Architecture(NamedTuple):
    """How an architecture's layer differs from Llama's (native_model.c's header says each)."""
    neox_rope: bool = False          # rope over the heads' two halves, not adjacent pairs
    qkv_bias: bool = False           # biases on query, key and value
    qk_norm: bool = False            # query and key heads RMS-normalised before rope
    scaled_embedding: bool = False   # the token embedding times sqrt(width)
    post_norms: bool = False         # a norm after attention and after the MLP
    gelu: bool = False               # GELU (tanh) gating, not SiLU
    full_attention_every: int = 0    # n: every n-th layer attends fully, the others to a sliding window
    local_rope_base: float = 0.0     # the sliding layers' rope base


# The GGUF architectures the native kernels run (general.architecture). Mistral files are "llama".
# Gemma 3: every sixth layer attends fully, as llama.cpp has it; its files do not record the local rope base.
ARCHITECTURES = {
    "llama": Architecture(),
    "qwen2": Architecture(neox_rope=True, qkv_bias=True),
    "qwen3": Architecture(neox_rope=True, qk_norm=True),
    "gemma3": Architecture(neox_rope=True, qk_norm=True, scaled_embedding=True, post_norms=True, gelu=True,
                           full_attention_every=6, local_rope_base=10000.0),
}


class HsMat(ctypes.Structure):
    _fields_ = [("qs", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("fmt", ctypes.c_int), ("rows", ctypes.c_int), ("cols", ctypes.c_int),
                ("scales", ctypes.c_void_p), ("offsets", ctypes.c_void_p), ("sub", ctypes.c_void_p)]


class HsLayer(ctypes.Structure):
    _fields_ = [(name, HsMat) for name in LAYER_MATRICES] + [
        (name, ctypes.c_void_p) for name in ("attn_norm", "ffn_norm", *QK_NORMS, *POST_NORMS)] + [
        ("sliding", ctypes.c_int)] + [(name, ctypes.c_void_p) for name in BIASES]


class HsModel(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in
                ("n_layer", "n_embd", "n_head", "n_kv", "head_dim", "n_ff", "n_vocab", "n_ctx")] + [
        ("eps", ctypes.c_float), ("rope_base", ctypes.c_float), ("embd", HsMat), ("out", HsMat),
        ("out_norm", ctypes.c_void_p), ("layers", ctypes.POINTER(HsLayer)),
        ("kcache", ctypes.c_void_p), ("vcache", ctypes.c_void_p), ("work", ctypes.c_void_p),
        ("neox_rope", ctypes.c_int), ("gelu", ctypes.c_int), ("window", ctypes.c_int),
        ("embd_scale", ctypes.c_float), ("rope_base_local", ctypes.c_float), ("out_fast", HsMat),
        ("rope_freqs", ctypes.c_void_p), ("rope_scale", ctypes.c_float),
        ("halt", ctypes.c_void_p)]          # an int a step stops at once it is not 0 (NativeModel.forward)


class Weights(NamedTuple):
    """How a file's tensors become the C side's: what reads them, what keeps them alive."""
    lib: ctypes.CDLL          # native_model.c, which lays K-quants out (hs_pack_q4_k, hs_pack_q6_k)
    tensors: dict             # the file's, by name (gguf_tensors.read_gguf)
    keep: list                # the arrays the C side reads: held as long as the model
    formats: dict             # matrices counted by how they are held, for the description
    exact: bool               # every value exactly (a target): see EXACT_LAYOUTS
    window: bool              # a target's matrices in the window products' row tiles (FMT_T*) where rows allow
    four_bit: bool = False    # a draft's layers in 4 bits: every matrix not Q4_0 as Q4_1 (_rounded_to_q4_1)
    tiles: bool = False       # a draft's layers' Q4_1 in row tiles (FMT_T4_1), which its steps read
    pairs: bool = False       # the rest of a window target's matrices in AVX-512's pair layouts (FMT_W8, FMT_N4, FMT_N6)

    def count(self, kind: str) -> None:
        self.formats[kind] = self.formats.get(kind, 0) + 1


def describe(meta: dict, w: Weights, n_ctx: int, embedding=None):
    """(the C side's model, its layers): its shape from the file's metadata, its matrices
    and norms from its tensors; the token embeddings from `embedding`'s rows where given
    (a file_embedding.FileEmbedding)."""
    model, arch = _shape(meta, n_ctx)
    model.embd = _mat(w, "token_embd.weight") if embedding is None else embedding.mat()
    model.out = _mat(w, "output.weight") if "output.weight" in w.tensors else model.embd
    model.n_vocab = model.out.rows
    model.out_norm = _vector(w, "output_norm.weight", model.n_embd)
    if "rope_freqs.weight" in w.tensors:        # Llama 3's rope scaling
        model.rope_freqs = _vector(w, "rope_freqs.weight", model.head_dim // 2)
    layers = (HsLayer * model.n_layer)()
    for i, layer in enumerate(layers):
        _fill_layer(layer, i, model, arch, w)
    _check_shapes(model, layers)
    model.layers = layers
    return model, layers


def _shape(meta: dict, n_ctx: int) -> tuple[HsModel, Architecture]:
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
    sliding = arch.full_attention_every > 0
    model = HsModel(n_layer=number("block_count"), n_embd=n_embd, n_head=n_head,
                    n_kv=number("attention.head_count_kv", n_head), head_dim=head_dim,
                    n_ff=number("feed_forward_length"), n_ctx=n_ctx,
                    eps=number("attention.layer_norm_rms_epsilon"), rope_base=number("rope.freq_base", 10000.0),
                    neox_rope=int(arch.neox_rope), gelu=int(arch.gelu),
                    window=number("attention.sliding_window") if sliding else 0,
                    embd_scale=float(np.sqrt(np.float32(n_embd))) if arch.scaled_embedding else 1.0,
                    rope_scale=_rope_scale(meta, name))
    model.rope_base_local = arch.local_rope_base if sliding else model.rope_base
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


def _fill_layer(layer: HsLayer, i: int, model: HsModel, arch: Architecture, w: Weights) -> None:
    widths = {"bq": model.n_head * model.head_dim, "bk": model.n_kv * model.head_dim,
              "bv": model.n_kv * model.head_dim}
    vectors = {"attn_norm": ("attn_norm", "weight", model.n_embd), "ffn_norm": ("ffn_norm", "weight", model.n_embd)}
    if arch.qk_norm:
        vectors.update({field: (name, "weight", model.head_dim) for field, name in QK_NORMS.items()})
    if arch.qkv_bias:
        vectors.update({field: (name, "bias", widths[field]) for field, name in BIASES.items()})
    if arch.post_norms:
        vectors.update({field: (name, "weight", model.n_embd) for field, name in POST_NORMS.items()})
    for field, name in LAYER_MATRICES.items():
        setattr(layer, field, _mat(w, f"blk.{i}.{name}.weight", body=True))
    for field, (name, kind, n) in vectors.items():
        setattr(layer, field, _vector(w, f"blk.{i}.{name}.{kind}", n))
    every = arch.full_attention_every
    layer.sliding = int(every > 0 and (i + 1) % every != 0)


def _check_shapes(model: HsModel, layers) -> None:
    n_embd, q_dim, kv_dim = model.n_embd, model.n_head * model.head_dim, model.n_kv * model.head_dim
    shapes = {"wq": (q_dim, n_embd), "wk": (kv_dim, n_embd), "wv": (kv_dim, n_embd), "wo": (n_embd, q_dim),
              "gate": (model.n_ff, n_embd), "up": (model.n_ff, n_embd), "down": (n_embd, model.n_ff)}
    for field, (rows, cols) in shapes.items():
        mat = getattr(layers[0], field)
        if (mat.rows, mat.cols) != (rows, cols):
            raise Unsupported(f"blk.0 {field} is {mat.rows} x {mat.cols}, not the {rows} x {cols} of a layer")
    if model.embd.cols != n_embd or model.out.cols != n_embd or model.out.rows != model.n_vocab:
        raise Unsupported("the embedding and output matrices do not match the model's width and vocabulary")


# ---- a matrix's layout: one function per layout, chosen by EXACT_LAYOUTS and WINDOW_LAYOUTS ----


def _as_stored(w: Weights, tensor, rows: int, cols: int, tiled: bool = False) -> HsMat:
    """Q8_0, Q4_0 or Q4_1 blocks taken apart into quants, scales and offsets (one array
    each, row by row): the kernel then reads eight blocks' scales at once. A target's Q4_1
    (or with `tiled` a draft's) in row tiles instead."""
    fmt = tensor.type_name
    blocks = tensor.data.reshape(rows, cols // BLOCK, -1)
    first = 4 if fmt == "Q4_1" else 2                  # d (and m) come before the quants
    quants, scales = blocks[:, :, first:], blocks[:, :, :2].view(np.uint16)     # views: copied once
    w.count(fmt)
    if w.window and fmt == "Q8_0":
        return _window_q8_0(w, quants, scales, rows, cols)
    offsets = [blocks[:, :, 2:4].view(np.uint16)] if fmt == "Q4_1" else []
    if (tiled or w.window and w.exact) and fmt == "Q4_1" and rows % 16 == 0:
        return _q4_1_tiles(w, quants, scales, offsets[0], rows, cols)
    return _split_blocks(w, fmt, [quants, scales, *offsets], rows, cols)


def _split_blocks(w: Weights, fmt: str, parts: list, rows: int, cols: int) -> HsMat:
    """Quants, scales (and Q4_1's offsets) each copied into an array of its own."""
    arrays = [np.ascontiguousarray(p) for p in parts]
    w.keep.extend(arrays)
    qs, d, m = [a.ctypes.data for a in arrays] + [None] * (3 - len(arrays))
    return HsMat(qs, d, m, FORMATS[fmt], rows, cols)


def _rounded_to_q8_0(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """Another block type as Q8_0 (block_layouts.as_q8_0: exact for Q5_0)."""
    q, d = layouts.as_q8_0(tensor, rows, cols)
    w.count(f"Q8_0 from {tensor.type_name}")
    if w.window:
        return _window_q8_0(w, q, d, rows, cols)
    return _split_blocks(w, "Q8_0", [q, d], rows, cols)


def _rounded_to_q4_1(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """A draft's matrix in 4 bits ([draft] weights = "q4_1"): rounded to Q8_0 (its own
    blocks, or as_q8_0), then to Q4_1 as the output layer's copy is (hs_q4_1_from_q8_0).
    A step reads about half the bytes; the draft agrees with the target a little less."""
    if tensor.type_name == "Q8_0":
        blocks = tensor.data.reshape(rows, cols // BLOCK, -1)
        q, d = np.ascontiguousarray(blocks[:, :, 2:]), np.ascontiguousarray(blocks[:, :, :2]).view(np.uint16)
    else:
        q, d = layouts.as_q8_0(tensor, rows, cols)
    n = rows * (cols // BLOCK)
    qs, d4, m4 = np.empty((n, 16), np.uint8), np.empty(n, np.uint16), np.empty(n, np.uint16)
    w.lib.hs_q4_1_from_q8_0(q.ctypes.data, d.ctypes.data, n, qs.ctypes.data, d4.ctypes.data, m4.ctypes.data)
    w.count(f"Q4_1 from {tensor.type_name}")
    if w.tiles and rows % 16 == 0:
        return _q4_1_tiles(w, qs.reshape(rows, -1, 16), d4, m4, rows, cols)
    w.keep.extend((qs, d4, m4))
    return HsMat(qs.ctypes.data, d4.ctypes.data, m4.ctypes.data, FORMATS["Q4_1"], rows, cols)


def _window_q8_0(w: Weights, q: np.ndarray, d: np.ndarray, rows: int, cols: int) -> HsMat:
    """Q8_0 values in the window products' tiles of 16 rows (FMT_T8_0, block_layouts.row_tiles),
    or where the rows are not whole tiles in pairs of blocks (FMT_W8, block_layouts.window_int8;
    AVX-512) or as stored (AVX2)."""
    if rows % 16 == 0:
        qs, d16 = layouts.row_tiles(q.reshape(rows, cols // BLOCK, BLOCK), d.reshape(rows, -1))
        w.keep.extend((qs, d16))
        return HsMat(qs.ctypes.data, d16.ctypes.data, None, formats.ROW_TILED["Q8_0"], rows, cols)
    if not w.pairs:
        return _split_blocks(w, "Q8_0", [q.reshape(rows, -1, BLOCK), d.reshape(rows, -1)], rows, cols)
    qs, scales = layouts.window_int8(q.reshape(rows, cols // BLOCK, BLOCK), d.reshape(rows, cols // BLOCK))
    w.keep.extend((qs, scales))
    return HsMat(qs.ctypes.data, None, None, formats.WINDOW_INT8, rows, cols, scales.ctypes.data, None)


def _q4_1_tiles(w: Weights, quants: np.ndarray, d: np.ndarray, m: np.ndarray, rows: int, cols: int) -> HsMat:
    """Q4_1 in the window products' tiles of 16 rows (FMT_T4_1, block_layouts.row_tiles)."""
    qs, d16, m16 = layouts.row_tiles(quants, d.reshape(rows, -1), m.reshape(rows, -1))
    w.keep.extend((qs, d16, m16))
    return HsMat(qs.ctypes.data, d16.ctypes.data, m16.ctypes.data, formats.ROW_TILED["Q4_1"], rows, cols)


def _as_floats(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """F16 and F32 matrices: the file's own bytes, not copied."""
    if cols % 16:
        raise Unsupported(f"{tensor.name} has rows of {cols} values; the float kernels take multiples of 16")
    data = np.ascontiguousarray(tensor.data)
    w.keep.append(data)
    w.count(tensor.type_name)
    return HsMat(data.ctypes.data, None, None, formats.FLOAT_FORMATS[tensor.type_name], rows, cols)


def _k_blocks(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """Q4_K and Q6_K at their own size (FMT_K4, FMT_K6)."""
    qs, sub, scales = layouts.as_k(w.lib, tensor, rows, cols)
    w.keep.extend((qs, sub, scales))
    w.count(tensor.type_name)
    return HsMat(qs.ctypes.data, None, None, formats.K_FORMATS[tensor.type_name], rows, cols, scales.ctypes.data, None,
                 sub.ctypes.data)


def _q5_blocks(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """Q5_0 at its own size (FMT_Q5)."""
    qs, d = layouts.as_q5(tensor, rows, cols)
    w.keep.extend((qs, d))
    w.count(tensor.type_name)
    return HsMat(qs.ctypes.data, d.ctypes.data, None, formats.Q5_FORMAT, rows, cols)


def _int8(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """Q5_1 and K-quants as int8 quants with a float scale per 16 and offset per 32 (FMT_I8)."""
    q, scales, offsets = layouts.as_i8(tensor, rows, cols)
    w.keep.extend(a for a in (q, scales, offsets) if a is not None)
    w.count(f"{tensor.type_name} exact")
    return HsMat(q.ctypes.data, None, None, formats.EXPANDED_FORMAT, rows, cols, scales.ctypes.data,
                 offsets.ctypes.data if offsets is not None else None)


def _nibbles(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """Q4_K and Q6_K as FMT_I8's values in 4 and 6 bits (FMT_N4, FMT_N6)."""
    qs, scales, offsets, top = layouts.as_nibbles(tensor, rows, cols)
    w.keep.extend(a for a in (qs, scales, offsets, top) if a is not None)
    w.count(f"{tensor.type_name} exact")
    return HsMat(qs.ctypes.data, None, None, formats.NIBBLE_FORMATS[tensor.type_name], rows, cols, scales.ctypes.data,
                 offsets.ctypes.data if offsets is not None else None, top.ctypes.data if top is not None else None)


def _k_tiles(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """Q4_K and Q6_K in the window products' tiles of 16 rows (FMT_T4_K, FMT_T6_K), or where
    the rows are not whole tiles in 4 and 6 bits (_nibbles, AVX-512) or at their own size
    (_k_blocks, AVX2)."""
    if rows % 16:
        return _nibbles(w, tensor, rows, cols) if w.pairs else _k_blocks(w, tensor, rows, cols)
    qs, scales, offsets = layouts.k_row_tiles(tensor, rows, cols)
    w.keep.extend(a for a in (qs, scales, offsets) if a is not None)
    w.count(f"{tensor.type_name} exact")
    return HsMat(qs.ctypes.data, None, None, formats.ROW_TILED[tensor.type_name], rows, cols, scales.ctypes.data,
                 offsets.ctypes.data if offsets is not None else None)


# A target's layouts by block type (exact values); a draft holds FORMATS as stored, the rest rounded to Q8_0.
EXACT_LAYOUTS = {"Q8_0": _as_stored, "Q4_0": _as_stored, "Q4_1": _as_stored, "Q5_0": _q5_blocks, "Q5_1": _int8,
                 "Q4_K": _k_blocks, "Q5_K": _int8, "Q6_K": _k_blocks, "F16": _as_floats, "F32": _as_floats}


def _q5_window(w: Weights, tensor, rows: int, cols: int) -> HsMat:
    """Q5_0 as Q8_0 (exactly) where its rows make tiles or AVX-512 reads it in pairs, else at its own size."""
    return _rounded_to_q8_0(w, tensor, rows, cols) if rows % 16 == 0 or w.pairs else _q5_blocks(w, tensor, rows, cols)


# With the window layout: row tiles where the rows allow (both instruction sets' products
# read them); the rest in AVX-512's pair layouts, whose products read neither FMT_K4, FMT_K6
# nor FMT_Q5, or (AVX2) in EXACT_LAYOUTS'.
WINDOW_LAYOUTS = {**EXACT_LAYOUTS, "Q5_0": _q5_window, "Q4_K": _k_tiles, "Q6_K": _k_tiles}


def _mat(w: Weights, name: str, body: bool = False) -> HsMat:
    """The tensor `name` in the layout its block type takes in this model (body: a layer's
    matrix, which a four_bit draft holds in 4 bits)."""
    tensor = w.tensors.get(name)
    if tensor is None:
        raise Unsupported(f"the file has no tensor {name}")
    cols, rows = tensor.shape[0], int(np.prod(tensor.shape[1:]))
    fmt = tensor.type_name
    if not w.exact and body and w.four_bit and fmt not in ("Q4_0", "Q4_1"):
        return _rounded_to_q4_1(w, tensor, rows, cols)
    if not w.exact:
        if fmt in FORMATS:
            return _as_stored(w, tensor, rows, cols, tiled=body and w.tiles)
        return _rounded_to_q8_0(w, tensor, rows, cols)
    layout = (WINDOW_LAYOUTS if w.window else EXACT_LAYOUTS).get(fmt)
    if layout is None:
        raise Unsupported(f"{name} is {fmt}, which hetspec's kernels cannot hold exactly (they read Q4_0, Q4_1, "
                          "Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16 and F32)")
    return layout(w, tensor, rows, cols)


def _vector(w: Weights, name: str, n: int) -> int:
    """A norm's weights or a bias: n float32 values."""
    tensor = w.tensors.get(name)
    if tensor is None or tensor.type_name != "F32" or tensor.shape[0] != n:
        raise Unsupported(f"{name} must be {n} float32 values")
    w.keep.append(np.array(tensor.data).view(np.float32))
    return w.keep[-1].ctypes.data
