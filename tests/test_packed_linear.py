"""oneDNN-prepacked linear layers compute what torch's do, for every window size."""
import copy

import pytest
import torch

from hetspec.models import resolve_model
from hetspec.workers.common.hf_loading import load_causal_lm
from hetspec.workers.target.packed_linear import PackedLinear, onednn_available, pack_linears

from helpers import TARGET

pytestmark = pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")


BF16_KERNELS = torch.ops.mkldnn._is_mkldnn_bf16_supported()   # oneDNN's bf16 products need AVX-512 (or AMX)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not BF16_KERNELS, reason="this CPU has no oneDNN bfloat16 kernels: pack_linears leaves the model alone"))])
def test_packed_model_gives_the_same_logits(dtype):
    plain = load_causal_lm(resolve_model(TARGET), dtype)
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) == sum(type(m) is torch.nn.Linear for m in plain.modules())
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    tolerance = 1e-4 if dtype == "float32" else 3e-2
    with torch.inference_mode():
        for rows in (1, 2, 3, 4, 9):            # 2 and 3 rows take the padded path
            ids = torch.arange(5, 5 + rows).view(1, -1)
            want, got = plain(ids).logits.float(), packed(ids).logits.float()
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=tolerance, atol=tolerance * float(want.abs().max()))
            assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_bias_is_kept():
    linear = torch.nn.Linear(16, 8)
    x = torch.randn(2, 3, 16)
    with torch.inference_mode():
        assert torch.allclose(PackedLinear(linear)(x), linear(x), atol=1e-5)


@pytest.mark.skipif(BF16_KERNELS, reason="this CPU has oneDNN bfloat16 kernels")
def test_bfloat16_without_onednn_kernels_is_left_alone():
    plain = load_causal_lm(resolve_model(TARGET), "bfloat16")
    assert pack_linears(plain) == 0                # the probe product disagrees: torch's own layers stay
    assert any(type(m) is torch.nn.Linear for m in plain.modules())


def test_models_on_other_dtypes_are_left_alone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.float64))
    assert pack_linears(model) == 0 and type(model[0]) is torch.nn.Linear
