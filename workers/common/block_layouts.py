"""A GGUF file's blocks laid out again for the native kernels (formats.h's FMT_* layouts),
at load: native_weights.py chooses the layout, these functions make it. Each keeps the
file's values exactly, but as_q8_0's rounding of K-quants for a draft."""
from __future__ import annotations

import numpy as np

from hetspec.workers.kernels.formats import BLOCK, BY_NAME


class Unsupported(ValueError):
    """The file is not one the native model can run (another architecture or weight type)."""


def window_int8(q: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 quants (rows, blocks, 32) and float16 scales (rows, blocks, as uint16) as the
    window products read them (window_avx512.c): per pair of blocks 64 bytes, block b's dwords
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


def as_q8_0(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
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


def as_q5(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, float16 scales as uint16) of a Q5_0 tensor in FMT_Q5's layout (formats.h):
    the file's block (d, fifth bits, nibbles) with its nibbles first and its d apart."""
    blocks = np.asarray(tensor.data).reshape(rows, cols // BLOCK, BY_NAME["Q5_0"].block_bytes)
    packed = np.concatenate([blocks[:, :, 6:], blocks[:, :, 2:6]], axis=2).reshape(rows, -1)
    return packed, np.ascontiguousarray(blocks[:, :, :2]).view(np.uint16).reshape(rows, -1)


def as_i8(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
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


def as_nibbles(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(nibbles, float32 scales, float32 offsets or None, top bits or None) of a Q4_K or
    Q6_K tensor for FMT_N4 or FMT_N6 (formats.h): as_i8's exact values, the quants' low
    four bits two a byte as Q4_0 lays them out (byte j of a block: weights j and j + 16).
    Q4_K: its scales once per 32 (a sub-block's two halves share one). Q6_K: as_i8's
    q + 32's top two bits, 16 bytes a pair of blocks, and its scales per 16."""
    if tensor.type_name not in ("Q4_K", "Q6_K"):
        raise Unsupported(f"{tensor.name} is {tensor.type_name}; only Q4_K and Q6_K are held in nibbles")
    q, scales, offsets = as_i8(tensor, rows, cols)
    u = (q.astype(np.int16) + (32 if offsets is None else 0)).astype(np.uint8).reshape(rows, cols // 32, 32)
    nibbles = ((u[:, :, :16] & 15) | ((u[:, :, 16:] & 15) << 4)).reshape(rows, cols // 2)
    if offsets is not None:
        return nibbles, np.ascontiguousarray(scales[:, ::2]), offsets, None
    top = u >> 4
    if top.shape[1] % 2:                     # a last block without a partner: zeros beside it
        top = np.concatenate([top, np.zeros_like(top[:, :1])], axis=1)
    b, partner = top[:, 0::2], top[:, 1::2]  # (rows, pairs, 32): byte k holds b's k, partner's k, b's 16 + k, partner's
    bits = b[:, :, :16] | partner[:, :, :16] << 2 | b[:, :, 16:] << 4 | partner[:, :, 16:] << 6
    return nibbles, scales, None, np.ascontiguousarray(bits.reshape(rows, -1))


def as_k(lib, tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quants, integer sub-block scales, float scales) of a Q4_K or Q6_K tensor in
    FMT_K4 or FMT_K6's layout (formats.h), laid out by the C side (hs_pack_q4_k,
    hs_pack_q6_k): the file's values at the file's size. Per block of 32, the quants'
    low nibbles as Q4_0 orders them; Q6_K then 8 bytes of top bits. Q4_K: per 256
    weights 8 scales then 8 mins, and d, dmin as float32; Q6_K: an int8 scale per 16
    and d as float32."""
    fmt = tensor.type_name
    blocks = np.ascontiguousarray(tensor.data)
    n = rows * cols // 256                    # superblocks of 256 weights
    q4 = fmt == "Q4_K"
    qs = np.empty((rows, cols // BLOCK * (16 if q4 else 24)), np.uint8)
    sub = np.empty((rows, cols // 256 * 16), np.uint8)
    scales = np.empty((rows, cols // 256 * (2 if q4 else 1)), np.float32)
    pack = lib.hs_pack_q4_k if q4 else lib.hs_pack_q6_k
    pack(blocks.ctypes.data, n, qs.ctypes.data, sub.ctypes.data, scales.ctypes.data)
    return qs, sub, scales


def _tiled(per_row: np.ndarray) -> np.ndarray:
    """(rows, blocks, k) arrays of a row's values per block as a tile of 16 rows per block:
    (tiles, blocks, k, 16) where k counts dwords (uint32) or scales, row i's at [..., i]."""
    rows, nb, k = per_row.shape
    return np.ascontiguousarray(per_row.reshape(rows // 16, 16, nb, k).transpose(0, 2, 3, 1))


def row_tiles(quants: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """(quants, d[, m]) of Q4_1 (with m) or Q8_0 blocks (quants: rows x blocks x 16 or 32
    bytes; d, m: rows x blocks float16 bits) in FMT_T4_1's or FMT_T8_0's tiles of 16 rows
    (formats.h). Q8_0's quants + 128, unsigned."""
    rows, nb = d.shape
    if rows % 16:
        raise Unsupported(f"the row tiles take 16 rows; this matrix has {rows}")
    q = np.ascontiguousarray(quants).view(np.uint8).reshape(rows, nb, -1)
    if m is None:
        q = q ^ np.uint8(0x80)
    tiles = _tiled(np.ascontiguousarray(q).view(np.uint32)).view(np.uint8).reshape(rows, -1)
    scales = [_tiled(np.asarray(a, np.uint16).reshape(rows, nb, 1)) for a in ((d,) if m is None else (d, m))]
    return (tiles, *scales)


def k_row_tiles(tensor, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(quants, float32 scales, float32 offsets or None) of a Q4_K or Q6_K tensor in
    FMT_T4_K's or FMT_T6_K's tiles of 16 rows (formats.h): as_i8's exact values, Q6_K's
    quants + 32 as nibbles and top bits, its scales per 16."""
    if rows % 16:
        raise Unsupported(f"the row tiles take 16 rows; {tensor.name} has {rows}")
    q, scales, offsets = as_i8(tensor, rows, cols)
    nb = cols // BLOCK
    u = (q.astype(np.int16) + (32 if offsets is None else 0)).astype(np.uint8).reshape(rows, nb, 32)
    nibbles = _tiled(np.ascontiguousarray((u[:, :, :16] & 15) | ((u[:, :, 16:] & 15) << 4)).view(np.uint32))
    if offsets is not None:             # Q4_K: a scale per 32 (its halves share one), an offset per 32
        per_block = [_tiled(np.ascontiguousarray(a).reshape(rows, nb, 1)) for a in (scales[:, ::2], offsets)]
        return nibbles.view(np.uint8).reshape(rows, -1), *per_block
    top = (u >> 4).reshape(rows, nb, 2, 4, 4)          # [half, dword vector in the half, byte]
    packed = (top << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)).sum(axis=3, dtype=np.uint8)
    bits = _tiled(np.ascontiguousarray(packed).view(np.uint32).reshape(rows, nb, 2))
    quants = np.concatenate([nibbles.reshape(rows // 16, nb, -1).view(np.uint8),
                             bits.reshape(rows // 16, nb, -1).view(np.uint8)], axis=2)
    return quants.reshape(rows, -1), _tiled(scales.reshape(rows, nb, 2)), None
