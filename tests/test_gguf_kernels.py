"""The GGUF block kernels rebuild every weight exactly and multiply like torch,
and a GGUF target takes them only where its weights are the blocks' values."""
import copy
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hetspec.models import resolve_model
from hetspec.workers.common.hf_compat import cache_keyword
from hetspec.workers.common.hf_loading import load_causal_lm
from hetspec.workers.kernels.build import KernelBuildFailed
from hetspec.workers.kernels.formats import (
    BLOCK,
    EXPANDED_FORMAT,
    FLOAT_FORMATS,
    GGML_TYPES,
    K_FORMATS,
    KERNEL_FORMATS,
    NIBBLE_FORMATS,
    Q5_FORMAT,
    ROW_TILED,
    WINDOW_INT8,
)
from hetspec.workers.kernels.gguf_kernels import FORMATS, KernelUnavailable, load
from hetspec.workers.kernels.gguf_tensors import read_tensors
from hetspec.workers.target.gguf_linear import MAX_ROWS, GGUFLinear, attach_gguf_blocks

HEADER = Path(__file__).resolve().parent.parent / "workers" / "kernels" / "formats.h"


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    try:
        return load(str(tmp_path_factory.mktemp("cache")))
    except KernelBuildFailed:
        raise                                 # a broken C file fails, never skips
    except KernelUnavailable as exc:          # another CPU, no compiler: nothing to test here
        pytest.skip(str(exc))


def random_blocks(fmt: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Rows of valid blocks: float16 scales (and minimums) first, then random quants."""
    rng = np.random.default_rng(seed)
    block_bytes = FORMATS[fmt][1]
    blocks = rng.integers(0, 256, (rows, cols // 32, block_bytes), dtype=np.uint8)
    halves = 2 if fmt == "Q4_1" else 1
    scales = (rng.standard_normal((rows, cols // 32, halves)) * 0.02).astype(np.float16)
    blocks[:, :, :2 * halves] = scales.view(np.uint8).reshape(rows, cols // 32, 2 * halves)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_weights_are_rebuilt_bit_for_bit(kernels, fmt):
    rows, cols = 5, 96                         # an odd row count takes the single-row tiles too
    blocks = random_blocks(fmt, rows, cols)
    want = gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, fmt)).reshape(rows, cols)
    identity = torch.eye(cols)                 # x = I: each product is one weight plus exact zeros
    got = kernels.matmul(fmt, identity, blocks, rows).T.contiguous().numpy()
    # equal values; a weight of -0.0 (Q4_0's q = 8 times a negative d) sums to +0.0 here
    assert np.array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_products_match_torch_for_every_window_size(kernels, fmt):
    rows, cols = 7, 128
    blocks = random_blocks(fmt, rows, cols, seed=1)
    weight = torch.from_numpy(gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, fmt))
                              .reshape(rows, cols).astype(np.float32))
    for tokens in range(1, 2 * MAX_ROWS + 2):
        x = torch.randn(tokens, cols, generator=torch.Generator().manual_seed(tokens))
        want = x @ weight.T
        # any summation order stays within the classic bound K * u * sum |x w| of float32 dot products
        bound = cols * 2.0 ** -24 * (x.abs() @ weight.abs().T)
        assert ((kernels.matmul(fmt, x, blocks, rows) - want).abs() <= bound).all()


def test_python_and_c_agree_on_the_block_formats():
    """hetspec.workers.kernels.formats and workers/kernels/formats.h describe the same formats."""
    constants = {name: int(value) for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*) = (\d+)", HEADER.read_text())}
    assert {name: constants[f"FMT_{name}"] for name in KERNEL_FORMATS} == {n: f.code for n, f in KERNEL_FORMATS.items()}
    assert {name: constants[f"{name}_BYTES"] for name in KERNEL_FORMATS} == {
        n: f.block_bytes for n, f in KERNEL_FORMATS.items()}
    assert constants["FMT_I8"] == EXPANDED_FORMAT and constants["FMT_W8"] == WINDOW_INT8
    assert constants["FMT_Q5"] == Q5_FORMAT
    assert {name: constants[f"FMT_{name}"] for name in FLOAT_FORMATS} == FLOAT_FORMATS
    assert {name: constants[f"FMT_K{name[1]}"] for name in K_FORMATS} == K_FORMATS    # Q4_K: FMT_K4
    assert {name: constants[f"FMT_N{name[1]}"] for name in NIBBLE_FORMATS} == NIBBLE_FORMATS    # Q4_K: FMT_N4
    assert {name: constants[f"FMT_T{name[1:]}"] for name in ROW_TILED} == ROW_TILED       # Q4_1: FMT_T4_1
    assert sorted(k for k in constants if k.startswith("FMT_")) == sorted(
        [*(f"FMT_{n}" for n in KERNEL_FORMATS), "FMT_I8", "FMT_W8", "FMT_K4", "FMT_K6", "FMT_Q5", "FMT_F16", "FMT_F32",
         "FMT_N4", "FMT_N6", *(f"FMT_T{name[1:]}" for name in ROW_TILED)])
    assert constants["BLOCK"] == BLOCK


def test_the_ggml_type_table_matches_gguf():
    for code, (name, per_block, block_bytes) in GGML_TYPES.items():
        kind = gguf.GGMLQuantizationType(code)
        assert kind.name == name
        assert gguf.GGML_QUANT_SIZES[kind] == (per_block, block_bytes)
    assert all(GGML_TYPES[gguf.GGMLQuantizationType[name]].per_block == BLOCK for name in KERNEL_FORMATS)


def test_a_row_length_of_partial_blocks_is_refused(kernels):
    with pytest.raises(ValueError, match="refused a Q8_0 product"):
        kernels.matmul("Q8_0", torch.zeros(1, 40), np.zeros((2, 68), np.uint8), 2)


def test_a_failing_compiler_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.raises(KernelBuildFailed, match="building the GGUF kernels failed"):   # the tests' fixtures fail on it
        load(str(tmp_path))
    assert not any((tmp_path / "kernels").iterdir())      # no half-built library left behind


def test_a_missing_compiler_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(KernelUnavailable, match="no C compiler") as raised:   # a machine without: the tests skip
        load(str(tmp_path))
    assert not isinstance(raised.value, KernelBuildFailed)


@pytest.mark.integration
def test_tensor_index_matches_gguf_reader():
    path = resolve_model("builtin:smollm2").file
    ours = read_tensors(path)
    for tensor in gguf.GGUFReader(path).tensors:
        mine = ours[tensor.name]
        assert mine.ggml_type == int(tensor.tensor_type)
        assert np.array_equal(mine.data.reshape(-1), np.asarray(tensor.data).view(np.uint8).reshape(-1))


@pytest.mark.integration
def test_smollm2_target_verifies_from_its_blocks(kernels):
    spec = resolve_model("builtin:smollm2")
    plain = load_causal_lm(spec)
    swapped = copy.deepcopy(plain)
    with torch.no_grad():                      # one layer no longer holds its blocks' values exactly
        layer = swapped.model.layers[3].mlp.up_proj.weight
        layer[0, 0] = torch.nextafter(layer[0, 0], torch.tensor(1.0))
    assert attach_gguf_blocks(swapped, spec.file, kernels) == {"Q4_1": 209, "Q8_0": 1}
    assert type(swapped.model.layers[3].mlp.up_proj) is torch.nn.Linear
    assert type(swapped.model.layers[3].self_attn.q_proj) is GGUFLinear   # rows reordered by transformers
    assert type(swapped.lm_head) is GGUFLinear                           # the tied Q8_0 embedding
    with torch.no_grad():
        swapped.model.layers[3].mlp.up_proj.weight.copy_(plain.model.layers[3].mlp.up_proj.weight)
    ids = torch.randint(0, plain.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = plain(ids).logits[0]
        prefix = swapped(ids[:, :34], use_cache=True)          # 34 rows: oneDNN; the window: the blocks
        window = swapped(ids[:, 34:], **{cache_keyword(swapped): prefix.past_key_values}).logits[0]
    got = torch.cat([prefix.logits[0], window])
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    assert torch.equal(got.argmax(-1), want.argmax(-1))
