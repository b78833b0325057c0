"""The K-quants taken apart for the kernel (_as_i8 in workers/draft/native.py):
int8 quants, a float32 scale per 16 weights and, for Q4_K/Q5_K, an offset per
32 must give back gguf's own dequantized weights bit for bit, so that a kernel
reading them computes with the file's exact values. Checked on random blocks of
all three types (every bit pattern of quants and packed scales) and on the real
Gemma 3 file's Q4_K and Q6_K tensors."""
import gguf
import numpy as np
import pytest

from hetspec.models import resolve_model
from hetspec.workers.draft.native import Unsupported, _as_i8
from hetspec.workers.kernels.formats import BY_NAME
from hetspec.workers.kernels.gguf_tensors import GGUFTensor, read_gguf

F16_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}   # byte offsets of d (and dmin) in a block


def _weights(tensor: GGUFTensor) -> np.ndarray:
    """scale * q + offset in float32, as the kernel would have it."""
    cols, rows = tensor.shape[0], int(np.prod(tensor.shape[1:]))
    q, scales, offsets = _as_i8(tensor, rows, cols)
    assert q.dtype == np.int8 and q.shape == (rows, cols)
    assert scales.dtype == np.float32 and scales.shape == (rows, cols // 16)
    values = np.repeat(scales, 16, axis=1) * q.astype(np.float32)
    if tensor.type_name == "Q6_K":
        assert offsets is None and q.min() >= -32 and q.max() <= 31
        return values
    assert offsets.dtype == np.float32 and offsets.shape == (rows, cols // 32)
    assert q.min() >= 0 and q.max() <= (15 if tensor.type_name == "Q4_K" else 31)
    return values + np.repeat(offsets, 32, axis=1)


def _assert_exact(tensor: GGUFTensor) -> None:
    expected = gguf.quants.dequantize(np.asarray(tensor.data), gguf.GGMLQuantizationType(tensor.ggml_type))
    got = _weights(tensor)
    assert got.dtype == expected.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got, expected)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))   # -0.0 and 0.0 told apart too


@pytest.mark.parametrize("fmt", ["Q4_K", "Q5_K", "Q6_K"])
def test_random_blocks_give_gguf_values_bit_for_bit(fmt):
    rng = np.random.default_rng(0)
    rows, cols = 6, 512
    kind = BY_NAME[fmt]
    data = rng.integers(0, 256, (rows, cols // 256 * kind.block_bytes), dtype=np.uint8)
    blocks = data.reshape(-1, kind.block_bytes)
    for at in F16_AT[fmt]:   # finite d and dmin of either sign
        d = rng.uniform(1e-3, 1e-1, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    _assert_exact(GGUFTensor("random", fmt, gguf.GGMLQuantizationType[fmt].value, (cols, rows), data))


def test_other_types_are_refused():
    tensor = GGUFTensor("q8", "Q8_0", 8, (256, 1), np.zeros((1, 272), np.uint8))
    with pytest.raises(Unsupported):
        _as_i8(tensor, 1, 256)


@pytest.mark.integration
def test_the_gemma_files_k_quants_give_gguf_values_bit_for_bit():
    tensors = read_gguf(resolve_model("builtin:gemma3-270m").file)[1]
    chosen = [t for t in tensors.values() if t.type_name in ("Q4_K", "Q6_K")]
    assert {t.type_name for t in chosen} == {"Q4_K", "Q6_K"}
    for tensor in chosen[:3] + chosen[-3:]:
        _assert_exact(tensor)
