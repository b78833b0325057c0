"""Linear layers with weights prepacked for oneDNN, for a target on the CPU.

A verify pass multiplies a handful of rows (the window) by every weight of the
target. torch's default CPU path (MKL sgemm) runs such small-M products far
below what reading the weights allows; oneDNN's prepacked weights take about
half its time (measured: e7e822d:docs/kernels.md). Packing once at load makes a
verify window nearly as cheap as one token, which is what speculative
decoding lives on.

The products are the same maths in another summation order, so logits differ
from torch's path in the last bits (like a batched pass differs from a
one-token one). `pack_linears` checks a layer against torch before swapping
and leaves the model alone where oneDNN is missing or disagrees.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def onednn_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


# oneDNN's kernels for 1-3 rows ran slower than for 4 (measured: e7e822d:docs/kernels.md), so fewer rows
# are padded to 4.
MIN_ROWS = 4


class PackedLinear(torch.nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout (packed once)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows >= MIN_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        padded = x.new_zeros(MIN_ROWS, self.in_features)
        padded[:rows] = x.reshape(rows, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(padded, self.packed, self.bias, "none", [], "")[:rows]
        return y.reshape(*x.shape[:-1], self.out_features)


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every nn.Linear of a CPU model by a PackedLinear; returns how many.
    0 when oneDNN is unavailable, the dtype is not float32/bfloat16, or a probe
    product disagrees with torch's beyond rounding."""
    linears = [(name, m) for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    if not linears or not onednn_available():
        return 0
    first = linears[0][1]
    if first.weight.device.type != "cpu" or first.weight.dtype not in (torch.float32, torch.bfloat16):
        return 0
    if not _agrees(first):
        return 0
    for name, module in linears:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, PackedLinear(module))
    return len(linears)


@torch.inference_mode()
def _agrees(linear: torch.nn.Linear) -> bool:
    """One probe product through both paths, within the dtype's rounding."""
    try:
        x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(linear.weight.dtype)
        want = F.linear(x, linear.weight, linear.bias).float()
        got = PackedLinear(linear)(x).float()
    except RuntimeError:
        return False
    tolerance = 1e-3 if linear.weight.dtype == torch.float32 else 5e-2
    return bool(torch.allclose(got, want, rtol=tolerance, atol=tolerance * float(want.abs().max())))
