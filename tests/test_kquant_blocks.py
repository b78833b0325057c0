"""The K-quants taken apart for the kernel (as_i8 in workers/common/block_layouts.py):
int8 quants, a float32 scale per 16 weights and, for Q4_K/Q5_K, an offset per
32 must give back gguf's own dequantized weights bit for bit, so that a kernel
reading them computes with the file's exact values. Checked on random blocks of
all three types (every bit pattern of quants and packed scales) and on the real
Gemma 3 file's Q4_K and Q6_K tensors. So must Q4_K and Q6_K laid out at their own
size by the C side (as_k: FMT_K4, FMT_K6), read as formats.h describes them."""
import gguf
import numpy as np
import pytest

from hetspec.models import resolve_model
from hetspec.workers.common.block_layouts import Unsupported, as_i8, as_k
from hetspec.workers.common.native_model import load_library
from hetspec.workers.kernels.formats import BY_NAME
from hetspec.workers.kernels.gguf_tensors import GGUFTensor, read_gguf

F16_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}   # byte offsets of d (and dmin) in a block


def _weights(tensor: GGUFTensor) -> np.ndarray:
    """scale * q + offset in float32, as the kernel would have it."""
    cols, rows = tensor.shape[0], int(np.prod(tensor.shape[1:]))
    q, scales, offsets = as_i8(tensor, rows, cols)
    assert q.dtype == np.int8 and q.shape == (rows, cols)
    assert scales.dtype == np.float32 and scales.shape == (rows, cols // 16)
    values = np.repeat(scales, 16, axis=1) * q.astype(np.float32)
    if tensor.type_name == "Q6_K":
        assert offsets is None and q.min() >= -32 and q.max() <= 31
        return values
    assert offsets.dtype == np.float32 and offsets.shape == (rows, cols // 32)
    assert q.min() >= 0 and q.max() <= (15 if tensor.type_name == "Q4_K" else 31)
    return values + np.repeat(offsets, 32, axis=1)


def _own_size_weights(tensor: GGUFTensor, lib) -> np.ndarray:
    """FMT_K4's (d * sc) * q - dmin * m, or FMT_K6's (d * sc) * (q - 32), in float32, read
    from as_k's arrays as formats.h lays them out."""
    cols, rows = tensor.shape[0], int(np.prod(tensor.shape[1:]))
    qs, sub, scales = as_k(lib, tensor, rows, cols)
    k6 = tensor.type_name == "Q6_K"
    blocks = qs.reshape(rows, cols // 32, 24 if k6 else 16)
    q = np.concatenate([blocks[:, :, :16] & 15, blocks[:, :, :16] >> 4], axis=2).astype(np.int32)
    sub = sub.reshape(rows, cols // 256, 16)
    if k6:   # byte j of the top bits: weights j, j + 8, j + 16, j + 24, two bits each
        top = (blocks[:, :, 16:24, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
        q |= top.transpose(0, 1, 3, 2).reshape(rows, cols // 32, 32).astype(np.int32) << 4
        scale = np.repeat(scales, 256, axis=1) * np.repeat(sub.view(np.int8).reshape(rows, -1), 16, axis=1)
        return scale.astype(np.float32) * (q.reshape(rows, cols) - 32).astype(np.float32)
    d, dmin = scales[:, 0::2], scales[:, 1::2]
    scale = np.repeat(np.repeat(d, 8, axis=1) * sub[:, :, :8].reshape(rows, -1), 32, axis=1)
    offset = np.repeat(np.repeat(dmin, 8, axis=1) * sub[:, :, 8:].reshape(rows, -1), 32, axis=1)
    return scale.astype(np.float32) * q.reshape(rows, cols).astype(np.float32) - offset.astype(np.float32)


def _assert_exact(tensor: GGUFTensor, lib=None) -> None:
    expected = gguf.quants.dequantize(np.asarray(tensor.data), gguf.GGMLQuantizationType(tensor.ggml_type))
    got = _own_size_weights(tensor, lib) if lib else _weights(tensor)
    assert got.dtype == expected.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got, expected)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))   # -0.0 and 0.0 told apart too


def random_tensor(fmt: str) -> GGUFTensor:
    rng = np.random.default_rng(0)
    rows, cols = 6, 512
    kind = BY_NAME[fmt]
    data = rng.integers(0, 256, (rows, cols // 256 * kind.block_bytes), dtype=np.uint8)
    blocks = data.reshape(-1, kind.block_bytes)
    for at in F16_AT[fmt]:   # finite d and dmin of either sign
        d = rng.uniform(1e-3, 1e-1, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return GGUFTensor("random", fmt, gguf.GGMLQuantizationType[fmt].value, (cols, rows), data)


@pytest.mark.parametrize("fmt", ["Q4_K", "Q5_K", "Q6_K"])
def test_random_blocks_give_gguf_values_bit_for_bit(fmt):
    _assert_exact(random_tensor(fmt))


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K"])
def test_random_blocks_at_their_own_size_give_gguf_values_bit_for_bit(fmt):
    _assert_exact(random_tensor(fmt), load_library())


def test_other_types_are_refused():
    tensor = GGUFTensor("q8", "Q8_0", 8, (256, 1), np.zeros((1, 272), np.uint8))
    with pytest.raises(Unsupported):
        as_i8(tensor, 1, 256)


@pytest.mark.integration
def test_the_gemma_files_k_quants_give_gguf_values_bit_for_bit():
    tensors = read_gguf(resolve_model("builtin:gemma3-270m").file)[1]
    chosen = [t for t in tensors.values() if t.type_name in ("Q4_K", "Q6_K")]
    assert {t.type_name for t in chosen} == {"Q4_K", "Q6_K"}
    lib = load_library()
    for tensor in chosen[:3] + chosen[-3:]:
        _assert_exact(tensor)
        _assert_exact(tensor, lib)
