"""The native kernels' products (workers/kernels/native_model.c) against float64.

hs_matvec, the draft's: for every block format it reads, with block counts that are
odd (a last 4-bit block without a partner for the two-block steps) and row counts
that do not fill its four-row tiles. The only error allowed is the one of rounding
the activations to int16 per block, plus float32 summation.

hs_window_matmat, the target's: against llama.cpp's rounding of the activations,
up to float32 summation; and Q8_0 laid out for it at load (FMT_W8), like Q5_0 read at
its own size (FMT_Q5), gives the same bits as the Q8_0 it equals, as Q4_K and Q6_K in 4
and 6 bits (FMT_N4, FMT_N6) give their int8 expansion's (FMT_I8)."""
import ctypes
import os
import shutil

import gguf
import numpy as np
import pytest

from hetspec.workers.common.block_layouts import as_i8, as_nibbles, as_q5, as_q8_0, k_row_tiles, row_tiles, window_int8
from hetspec.workers.common.native_model import SOURCES
from hetspec.workers.common.native_weights import FORMATS, HsMat
from hetspec.workers.kernels.build import KernelBuildFailed, KernelUnavailable, _build_key, built
from hetspec.workers.kernels.formats import EXPANDED_FORMAT, NIBBLE_FORMATS, Q5_FORMAT, ROW_TILED, WINDOW_INT8
from hetspec.workers.kernels.gguf_tensors import GGUFTensor

from helpers import isa_params


@pytest.fixture(scope="module", params=isa_params())
def library(request, tmp_path_factory):
    """The kernels built for this CPU, and for AVX2 alone (HETSPEC_ISA=avx2): an AVX-512
    machine tests both instruction sets' products."""
    saved = os.environ.get("HETSPEC_ISA")
    os.environ["HETSPEC_ISA"] = request.param
    try:
        with built(SOURCES, "native model kernels", str(tmp_path_factory.mktemp("cache"))) as path:
            lib = ctypes.CDLL(path)
    except KernelBuildFailed:
        raise                                 # a broken C file fails, never skips
    except KernelUnavailable as exc:          # another CPU, no compiler: nothing to test here
        pytest.skip(str(exc))
    finally:
        if saved is None:
            os.environ.pop("HETSPEC_ISA")
        else:
            os.environ["HETSPEC_ISA"] = saved
    lib.hs_matvec_work_floats.restype = ctypes.c_long
    lib.hs_matvec_work_floats.argtypes = [ctypes.c_int]
    lib.hs_matvec.argtypes = [ctypes.POINTER(HsMat), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def random_matrix(fmt: str, rows: int, cols: int, rng):
    """(the C side's arrays, the weights they stand for in float64)."""
    nb = cols // 32
    d = (rng.standard_normal((rows, nb)) * 0.02).astype(np.float16)
    m = (rng.standard_normal((rows, nb)) * 0.02).astype(np.float16) if fmt == "Q4_1" else None
    if fmt == "Q8_0":
        q = rng.integers(-127, 128, (rows, nb, 32)).astype(np.int8)
        qs, values = q.view(np.uint8), q.astype(np.float64)
    else:   # byte j of a block holds value j (low nibble) and value j + 16 (high nibble)
        q = rng.integers(0, 16, (rows, nb, 32)).astype(np.uint8)
        qs = q[:, :, :16] | (q[:, :, 16:] << 4)
        values = q.astype(np.float64) - (8.0 if fmt == "Q4_0" else 0.0)
    weights = values * d.astype(np.float64)[:, :, None]
    if m is not None:
        weights += m.astype(np.float64)[:, :, None]
    arrays = [np.ascontiguousarray(qs.reshape(rows, -1)), d, m]
    return arrays, weights.reshape(rows, cols)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("rows, cols", [(7, 96), (12, 576), (5, 1568)])
def test_matvec_is_the_product_up_to_rounding_the_activations(library, fmt, rows, cols):
    rng = np.random.default_rng(cols + rows)
    (qs, d, m), weights = random_matrix(fmt, rows, cols, rng)
    mat = HsMat(qs.ctypes.data, d.ctypes.data, m.ctypes.data if m is not None else None, FORMATS[fmt], rows, cols)
    x = (rng.standard_normal(cols) * np.exp(rng.standard_normal(cols))).astype(np.float32)   # uneven blocks
    y = np.zeros(rows, np.float32)
    work = np.zeros(library.hs_matvec_work_floats(cols), np.float32)
    library.hs_matvec(ctypes.byref(mat), x.ctypes.data, y.ctypes.data, work.ctypes.data)

    want = weights @ x.astype(np.float64)
    # each activation is off by at most half a step of its block's int16 grid
    step = np.abs(x.reshape(-1, 32)).max(axis=1) / 32767
    rounding = (np.abs(weights).reshape(rows, -1, 32).sum(axis=2) * step / 2).sum(axis=1)
    summation = 1e-5 * np.abs(weights) @ np.abs(x.astype(np.float64))
    assert np.all(np.abs(y - want) <= rounding + summation), np.abs(y - want) / (rounding + summation)
    assert np.abs(y - want).max() > 0   # not vacuous: float32 and the rounding show


def test_a_changed_header_builds_afresh(tmp_path):
    """The cached library's name covers the headers the C file includes (formats.h)."""
    folder = tmp_path / "kernels"
    shutil.copytree(os.path.dirname(SOURCES[0]), folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    sources = [str(folder / os.path.basename(source)) for source in SOURCES]
    before = _build_key(sources, "cc")
    assert _build_key(sources, "cc") == before
    with open(folder / "formats.h", "a") as f:
        f.write("/* changed */\n")
    assert _build_key(sources, "cc") != before


def llama_cpp_activations(x: np.ndarray, kind: str):
    """x rounded as llama.cpp's CPU backend rounds a matrix product's activations (its
    vec_dot_type): per block of 32 (q8_0, q8_1) or 256 values (q8_K), q = x * (127 / max|x|)
    to nearest even; the scale max / 127 in float16 (q8_0, q8_1) or 1 / (127 / max) in
    float32 (q8_K); q8_1's block sum float16(max / 127 * sum(q)). (per-32 scale, q, per-32 sums)"""
    group = 256 if kind == "q8_K" else 32
    blocks = x.reshape(-1, group)
    top = np.abs(blocks).max(axis=1)
    inv = np.divide(np.float32(127), top, out=np.zeros_like(top), where=top > 0)
    q = np.rint(blocks * inv[:, None]).astype(np.float32).reshape(-1, 32)
    if kind == "q8_K":
        scale = np.repeat(np.divide(np.float32(1), inv, out=np.zeros_like(inv), where=inv > 0), 8)
        return scale, q, scale * q.sum(axis=1)
    d = (top / np.float32(127)).astype(np.float32)
    scale = d.astype(np.float16).astype(np.float32)
    sums = (d * q.sum(axis=1)).astype(np.float16).astype(np.float32) if kind == "q8_1" else scale * q.sum(axis=1)
    return scale, q, sums


def random_expanded(rows: int, cols: int, rng):
    """A K-quant-like FMT_I8 matrix: int8 quants, a float32 scale per 16, an offset per 32."""
    q = rng.integers(-31, 32, (rows, cols)).astype(np.int8)
    scales = (rng.random((rows, cols // 16)) * 0.01).astype(np.float32)
    offsets = (-rng.random((rows, cols // 32)) * 0.05).astype(np.float32)
    return q, scales, offsets


def window_matmat(library, pair_layout: bool = False) -> None:
    """hs_window_matmat's signature; with pair_layout, a skip where the window products do
    not read window_avx512.c's layout (FMT_W8: AVX-512 VNNI only)."""
    if pair_layout and library.hs_pair_layout() != 1:
        pytest.skip("this CPU has no AVX-512 VNNI: Q8_0 is not laid out in pairs (window_avx2.c reads it as is)")
    library.hs_window_act_floats.restype = ctypes.c_long
    library.hs_window_act_floats.argtypes = [ctypes.c_int]
    library.hs_window_matmat.restype = ctypes.c_int
    library.hs_window_matmat.argtypes = [ctypes.POINTER(HsMat), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_void_p]


@pytest.mark.parametrize("fmt", [*sorted(FORMATS), "I8"])
def test_the_targets_window_rounds_activations_as_llama_cpp_does(library, fmt):
    """The native target's products (hs_window_matmat) are llama.cpp's arithmetic up to
    float32 summation: each weight type meets its activations rounded as llama.cpp rounds
    them (q8_0, q8_1 or q8_K), so the logits stay near the file's in llama.cpp. A
    float32 scale, the rounding the window used before, is told apart."""
    window_matmat(library)
    rng = np.random.default_rng(7)
    rows, cols, T = 9, 512, 5
    if fmt == "I8":
        q, scales, offsets = random_expanded(rows, cols, rng)
        mat = HsMat(q.ctypes.data, None, None, EXPANDED_FORMAT, rows, cols, scales.ctypes.data, offsets.ctypes.data)
        per32 = q.astype(np.float64).reshape(rows, -1, 32) * np.repeat(scales, 16, axis=1).reshape(rows, -1, 32)
        offset = offsets.astype(np.float64)
        kind = "q8_K"
    else:
        (qs, d, m), weights = random_matrix(fmt, rows, cols, rng)
        mat = HsMat(qs.ctypes.data, d.ctypes.data, m.ctypes.data if m is not None else None, FORMATS[fmt], rows, cols)
        nb = cols // 32
        values = weights.reshape(rows, nb, 32)
        offset = {"Q4_1": m, "Q4_0": -8 * d}.get(fmt)
        offset = None if offset is None else offset.astype(np.float64)
        per32 = values - (offset[:, :, None] if offset is not None else 0)   # the quants times d
        kind = {"Q4_1": "q8_1"}.get(fmt, "q8_0")
    x = (rng.standard_normal((T, cols)) * np.exp(rng.standard_normal((T, cols)))).astype(np.float32)
    y = np.zeros((T, rows), np.float32)
    work = np.zeros(T * library.hs_window_act_floats(cols), np.float32)
    mat_ref = ctypes.byref(mat)
    assert library.hs_window_matmat(mat_ref, x.ctypes.data, T, y.ctypes.data, work.ctypes.data) == 0

    def model(t: int, fp32_scale: bool = False) -> np.ndarray:
        scale, q, sums = llama_cpp_activations(x[t], kind)
        if fp32_scale and kind != "q8_K":
            top = np.abs(x[t].reshape(-1, 32)).max(axis=1)
            scale = (top / np.float32(127)).astype(np.float64)
            sums = scale * q.sum(axis=1)
        out = np.einsum("rbj,bj->r", per32, q.astype(np.float64) * np.asarray(scale, np.float64)[:, None])
        return out + (offset @ sums.astype(np.float64) if offset is not None else 0)

    summation = 2e-6 * np.abs(per32.reshape(rows, cols)) @ np.abs(x.astype(np.float64)).T + 1e-7
    for t in range(T):
        assert np.all(np.abs(y[t] - model(t)) <= summation[:, t]), (fmt, t, np.abs(y[t] - model(t)) / summation[:, t])
        one = np.zeros(rows, np.float32)
        assert library.hs_window_matmat(mat_ref, x[t].ctypes.data, 1, one.ctypes.data, work.ctypes.data) == 0
        assert np.array_equal(one, y[t])                          # a window of one: the same bits
    if kind != "q8_K":
        assert max(np.abs(y[t] - model(t, fp32_scale=True)).max() - summation[:, t].max() for t in range(T)) > 0


@pytest.mark.parametrize("rows, cols", [(9, 640), (6, 96)])
def test_q8_0_laid_out_for_the_window_gives_the_same_bits(library, rows, cols):
    """FMT_W8 (pairs of blocks interleaved, quants + 128, float32 scales; an odd last block
    paired with zeros) against the Q8_0 blocks it was made from, for windows of 1-11
    tokens, which take every tile shape (four rows for the last 1-3 tokens)."""
    window_matmat(library, pair_layout=True)
    rng = np.random.default_rng(3)
    (qs, d, _), _ = random_matrix("Q8_0", rows, cols, rng)
    plain = HsMat(qs.ctypes.data, d.ctypes.data, None, FORMATS["Q8_0"], rows, cols)
    laid, scales = window_int8(qs.reshape(rows, cols // 32, 32), d.view(np.uint16))
    window = HsMat(laid.ctypes.data, None, None, WINDOW_INT8, rows, cols, scales.ctypes.data, None)
    assert_same_window_bits(library, plain, window, 11, rng)


def assert_same_window_bits(library, a: HsMat, b: HsMat, widest: int, rng) -> np.ndarray:
    """Matrices a and b give the same bits through hs_window_matmat for windows of 1..widest
    random tokens; the last window's tokens."""
    rows, cols = a.rows, a.cols
    for T in range(1, widest + 1):
        x = (rng.standard_normal((T, cols)) * np.exp(rng.standard_normal((T, cols)))).astype(np.float32)
        work = np.zeros(T * library.hs_window_act_floats(cols), np.float32)
        y = [np.zeros((T, rows), np.float32) for _ in range(2)]
        for mat, out in zip((a, b), y):
            assert library.hs_window_matmat(ctypes.byref(mat), x.ctypes.data, T, out.ctypes.data, work.ctypes.data) == 0
        assert np.array_equal(y[0].view(np.uint32), y[1].view(np.uint32)), T
    return x


@pytest.mark.parametrize("rows, cols", [(9, 640), (6, 96)])
def test_q5_0_at_its_own_size_gives_the_bits_of_its_q8_0(library, rows, cols):
    """FMT_Q5 (the file's Q5_0 blocks, unpacked in the kernels) against the Q8_0 that holds
    the same values exactly, in the window products for windows of 1-9 tokens and in the
    draft's one-token product. Fifth bits set and clear, and scales of both signs, occur."""
    window_matmat(library)
    if library.hs_pair_layout() == 1:
        pytest.skip("with AVX-512 VNNI, Q5_0 is laid out as Q8_0 pairs (FMT_W8): FMT_Q5 is not made")
    rng = np.random.default_rng(5)
    values = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    tensor = GGUFTensor("w", "Q5_0", 6, (cols, rows), gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q5_0))
    qs, d = as_q5(tensor, rows, cols)
    q8, d8 = as_q8_0(tensor, rows, cols)
    own = HsMat(qs.ctypes.data, d.ctypes.data, None, Q5_FORMAT, rows, cols)
    as_q8 = HsMat(q8.ctypes.data, d8.ctypes.data, None, FORMATS["Q8_0"], rows, cols)
    x = assert_same_window_bits(library, own, as_q8, 9, rng)
    work = np.zeros(library.hs_matvec_work_floats(cols), np.float32)
    y = [np.zeros(rows, np.float32) for _ in range(2)]
    for mat, out in zip((own, as_q8), y):
        library.hs_matvec(ctypes.byref(mat), x[0].ctypes.data, out.ctypes.data, work.ctypes.data)
    assert np.array_equal(y[0].view(np.uint32), y[1].view(np.uint32))



@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows, cols", [(9, 768), (6, 256)])
def test_k_quants_in_nibbles_give_the_bits_of_their_int8_expansion(library, fmt, rows, cols):
    """FMT_N4 and FMT_N6 (Q4_K's and Q6_K's quants in 4 and 6 bits, float scales) against
    FMT_I8 (the same values as int8, a scale per 16), for windows of 1-11 tokens; and the
    same weights when a row is dequantized (the token embedding's path)."""
    window_matmat(library)
    if library.hs_pair_layout() != 1:
        pytest.skip("FMT_N4 and FMT_N6 are made only where the window products use AVX-512 VNNI")
    rng = np.random.default_rng(11)
    size, scale_at = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}[fmt]
    blocks = rng.integers(0, 256, (rows * cols // 256, size), dtype=np.uint8)      # every bit pattern of quants
    for at in scale_at:                                                            # finite d (dmin) of either sign
        d = rng.uniform(1e-3, 1e-1, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    tensor = GGUFTensor("w", fmt, gguf.GGMLQuantizationType[fmt].value, (cols, rows), blocks.reshape(rows, -1))
    q, scales, offsets = as_i8(tensor, rows, cols)
    qs, scales_n, offsets_n, top = as_nibbles(tensor, rows, cols)
    pointer = lambda a: a.ctypes.data if a is not None else None
    expanded = HsMat(q.ctypes.data, None, None, EXPANDED_FORMAT, rows, cols, scales.ctypes.data, pointer(offsets))
    packed = HsMat(qs.ctypes.data, None, None, NIBBLE_FORMATS[fmt], rows, cols, scales_n.ctypes.data,
                   pointer(offsets_n), pointer(top))
    sizes = [sum(a.nbytes for a in arrays if a is not None) for arrays in ((q, scales, offsets), (qs, scales_n, offsets_n, top))]
    assert sizes[1] <= {"Q4_K": 0.55, "Q6_K": 0.8}[fmt] * sizes[0]
    assert_same_window_bits(library, expanded, packed, 11, rng)
    library.hs_dequantize_row.argtypes = [ctypes.POINTER(HsMat), ctypes.c_int, ctypes.c_void_p]
    rows_out = [np.zeros(cols, np.float32) for _ in range(2)]
    for mat, out in zip((expanded, packed), rows_out):
        library.hs_dequantize_row(ctypes.byref(mat), rows - 1, out.ctypes.data)
    assert np.array_equal(rows_out[0].view(np.uint32), rows_out[1].view(np.uint32))


def assert_same_rows(library, a: HsMat, b: HsMat) -> None:
    """Every row of a and b dequantized (the token embedding's path) gives the same bits."""
    library.hs_dequantize_row.argtypes = [ctypes.POINTER(HsMat), ctypes.c_int, ctypes.c_void_p]
    for r in range(a.rows):
        pair = [np.zeros(a.cols, np.float32) for _ in range(2)]
        for mat, out in zip((a, b), pair):
            library.hs_dequantize_row(ctypes.byref(mat), r, out.ctypes.data)
        assert np.array_equal(pair[0].view(np.uint32), pair[1].view(np.uint32)), r


def random_k_quants(fmt: str, rows: int, cols: int, rng) -> GGUFTensor:
    """A Q4_K or Q6_K tensor of random blocks: every bit pattern of quants, finite scales of both signs."""
    size, scale_at = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}[fmt]
    blocks = rng.integers(0, 256, (rows * cols // 256, size), dtype=np.uint8)
    for at in scale_at:
        d = rng.uniform(1e-3, 1e-1, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return GGUFTensor("w", fmt, gguf.GGMLQuantizationType[fmt].value, (cols, rows), blocks.reshape(rows, -1))


def stored_and_tiled(fmt: str, rows: int, cols: int, rng) -> tuple[HsMat, HsMat, np.ndarray, list]:
    """(the blocks as stored, or FMT_I8 for K-quants; the same in row tiles; the weights; the arrays)."""
    pointer = lambda a: a.ctypes.data if a is not None else None
    if fmt in ("Q4_K", "Q6_K"):
        tensor = random_k_quants(fmt, rows, cols, rng)
        q, scales, offsets = as_i8(tensor, rows, cols)
        stored = HsMat(q.ctypes.data, None, None, EXPANDED_FORMAT, rows, cols, scales.ctypes.data, pointer(offsets))
        tiles = k_row_tiles(tensor, rows, cols)
        tiled = HsMat(tiles[0].ctypes.data, None, None, ROW_TILED[fmt], rows, cols, tiles[1].ctypes.data, pointer(tiles[2]))
        weights = np.repeat(scales, 16, axis=1) * q + (np.repeat(offsets, 32, axis=1) if offsets is not None else 0)
        return stored, tiled, weights, [q, scales, offsets, *tiles]
    (qs, d, m), weights = random_matrix(fmt, rows, cols, rng)
    stored = HsMat(qs.ctypes.data, d.ctypes.data, pointer(m), FORMATS[fmt], rows, cols)
    tiles = row_tiles(qs.reshape(rows, cols // 32, -1), d.view(np.uint16), m.view(np.uint16) if m is not None else None)
    assert sum(a.nbytes for a in tiles) == sum(a.nbytes for a in (qs, d, m) if a is not None)
    tiled = HsMat(*[a.ctypes.data for a in tiles], *[None] * (3 - len(tiles)), ROW_TILED[fmt], rows, cols)
    return stored, tiled, weights, [qs, d, m, *tiles]


@pytest.mark.parametrize("fmt", sorted(ROW_TILED))
@pytest.mark.parametrize("rows, cols", [(48, 512), (16, 256)])
def test_row_tiles_of_16(library, fmt, rows, cols):
    """The row tiles (FMT_T4_1, FMT_T8_0, FMT_T4_K, FMT_T6_K: a row a lane of the products)
    against the blocks they were made from (K-quants: their int8 expansion, FMT_I8): the
    same weights when a row is dequantized; a token's rows the same bits in windows of 1-11
    tokens as alone, whatever tokens are beside it; and the products within float32's
    rounding of the blocks' (their float steps differ)."""
    window_matmat(library)
    rng = np.random.default_rng(13)
    stored, tiled, weights, _arrays = stored_and_tiled(fmt, rows, cols, rng)
    assert_same_rows(library, stored, tiled)

    def products(mat: HsMat, x: np.ndarray) -> np.ndarray:
        y = np.zeros((len(x), rows), np.float32)
        work = np.zeros(len(x) * library.hs_window_act_floats(cols), np.float32)
        assert library.hs_window_matmat(ctypes.byref(mat), x.ctypes.data, len(x), y.ctypes.data, work.ctypes.data) == 0
        return y

    x = rng.standard_normal((11, cols)).astype(np.float32)
    alone = np.concatenate([products(tiled, x[t:t + 1]) for t in range(len(x))])
    for T in range(1, len(x) + 1):
        start = T % 3                        # windows that start at other tokens too
        window = np.ascontiguousarray(x[start:start + T]) if start + T <= len(x) else x[:T]
        first = start if start + T <= len(x) else 0
        got = products(tiled, window)
        assert np.array_equal(got.view(np.uint32), alone[first:first + T].view(np.uint32)), T
        bound = 4 * cols * 2.0 ** -24 * (np.abs(window) @ np.abs(weights).T) + 1e-6
        assert (np.abs(got - products(stored, window)) <= bound).all(), T
