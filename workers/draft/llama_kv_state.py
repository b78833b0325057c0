"""A llama.cpp sequence state built from another model's attention cache.

When the draft is a quantized copy of the target, the target's KV cache of a
prompt, computed anyway for the first token, can stand in for the draft's own
prefill of it (the longest step before speculation starts on a long prompt).

llama.cpp's per-sequence state (llama_state_seq_get_data) is an 8-byte header,
then one section per KV cache: a model with sliding-window layers (Gemma 3)
keeps two caches, its full-attention layers' first, then the sliding ones'.
A section is n_stream (u32), cell count (u32), per cell pos (i32), n_seq_id
(u32), seq_id (i32); v_trans (u32), n_layer (u32); per layer K: type (i32),
row bytes (u64), the rows; then per layer V the same, or, with v_trans, type
(i32), element bytes (u32), n_embd_v (u32) and V transposed. The layout is
read from a one-token state of the live context and anything unexpected
raises, so a llama.cpp that writes another layout fails loudly rather than
drafting from garbage.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

GGML_TYPE_F16 = 1
MAX_SECTIONS = 2              # one cache, or a full-attention and a sliding-window one


@dataclass
class StateLayout:
    header: bytes
    sections: list[int]  # layers per cache, in the state's order (full-attention first)
    kv_dim: int          # n_kv_heads x head_dim
    v_trans: bool

    @property
    def n_layer(self) -> int:
        return sum(self.sections)


def read_layout(state: bytes) -> StateLayout:
    """The layout of a one-token, one-sequence state; raises ValueError if it is not the one above."""
    header, off = state[:8], 8
    sections, kv_dims, v_transes = [], set(), set()
    while off < len(state) and len(sections) < MAX_SECTIONS:
        layers, v_trans, off = _read_section(state, off, kv_dims)
        sections.append(layers)
        v_transes.add(v_trans)
    if off != len(state):
        _fail(f"{len(state) - off} bytes left over")
    if len(kv_dims) != 1 or len(v_transes) != 1:
        _fail(f"K and V widths {sorted(kv_dims)}, v_trans {sorted(v_transes)}")
    return StateLayout(header, sections, kv_dims.pop(), bool(v_transes.pop()))


def _read_section(state: bytes, off: int, kv_dims: set) -> tuple[int, int, int]:
    """One cache's cells header, then its layers' K rows and V rows: (layers, v_trans, the
    offset after it); each row's width goes into kv_dims."""
    if len(state) - off < 28:
        _fail(f"{len(state) - off} bytes left over")
    n_stream, cells, pos, n_seq, seq = struct.unpack_from("<IIiIi", state, off)
    if (n_stream, cells, pos, n_seq, seq) != (1, 1, 0, 1, 0):
        _fail(f"{n_stream} streams, {cells} cells, first at {pos} in {n_seq} sequence(s)")
    v_trans, layers = struct.unpack_from("<II", state, off + 20)
    off += 28
    if layers == 0:
        _fail("a cache without layers")
    for _ in range(layers):                                         # K
        typ, size = struct.unpack_from("<iQ", state, off)
        if typ != GGML_TYPE_F16 or size % 2:
            _fail(f"K type {typ}, row {size} bytes")
        kv_dims.add(size // 2)
        off += 12 + size
    for _ in range(layers):                                         # V
        n = _v_width(state, off, v_trans)
        kv_dims.add(n)
        off += 12 + 2 * n
    return layers, v_trans, off


def _v_width(state: bytes, off: int, v_trans: int) -> int:
    if v_trans:
        typ, el, n = struct.unpack_from("<iII", state, off)
        if typ != GGML_TYPE_F16 or el != 2:
            _fail(f"V type {typ}, {el}-byte elements")
        return n
    typ, size = struct.unpack_from("<iQ", state, off)
    if typ != GGML_TYPE_F16:
        _fail(f"V type {typ}")
    return size // 2


def _fail(why: str):
    raise ValueError(f"unexpected llama.cpp sequence state ({why})")


def build_state(layout: StateLayout, keys: np.ndarray, values: np.ndarray) -> bytearray:
    """A state holding positions 0..T-1 of sequence 0: keys in llama.cpp's order,
    keys and values shaped (layers, kv_heads, T, head_dim), float16, their layers
    in the order of the state's sections (full-attention layers first). A
    sliding-window cache gets every position too, as the draft's own prefill
    leaves it."""
    layers, heads, t, d = keys.shape
    if layers != layout.n_layer or heads * d != layout.kv_dim or values.shape != keys.shape:
        raise ValueError(f"KV of shape {keys.shape} does not fit {layout.n_layer} layers of {layout.kv_dim}")
    rows_k = keys.transpose(0, 2, 1, 3).reshape(layers, t, heads * d)      # one row per cell
    rows_v = values.transpose(0, 2, 1, 3).reshape(layers, t, heads * d)
    cells = np.zeros((t, 3), dtype=np.int32)
    cells[:, 0] = np.arange(t)           # pos; one sequence id each, sequence 0
    cells[:, 1] = 1
    parts, first = [layout.header], 0
    row = layout.kv_dim * 2
    for n_layer in layout.sections:
        section = range(first, first + n_layer)
        first += n_layer
        parts += [struct.pack("<II", 1, t), cells.tobytes(), struct.pack("<II", layout.v_trans, n_layer)]
        for layer in section:
            parts += [struct.pack("<iQ", GGML_TYPE_F16, row),
                      np.ascontiguousarray(rows_k[layer], np.float16).tobytes()]
        for layer in section:
            if layout.v_trans:
                parts += [struct.pack("<iII", GGML_TYPE_F16, 2, layout.kv_dim),
                          np.ascontiguousarray(rows_v[layer].T, np.float16).tobytes()]
            else:
                parts += [struct.pack("<iQ", GGML_TYPE_F16, row),
                          np.ascontiguousarray(rows_v[layer], np.float16).tobytes()]
    return bytearray(b"".join(parts))
