"""Linear layers that multiply a verify window straight from a GGUF file's blocks.

A target loaded from a quantized GGUF file is float32, but its weights are the
blocks' values. For a window of a few tokens the product is bound by reading
the weights, so reading the 4.5-8.5-bit blocks (workers/kernels/gguf_kernels.c)
makes it faster; a longer input (a prompt) is bound by arithmetic and goes
through oneDNN's prepacked float32 weights as before. A layer takes the blocks
only after its float32 weights were found to be exactly their values, bit for
bit, and a probe product agreed with torch's; every other layer is left alone.
"""
from __future__ import annotations

import os
import re

import numpy as np
import torch
import torch.nn.functional as F

from hetspec.ipc.specs import ModelSpec
from hetspec.workers.kernels.gguf_kernels import FORMATS, GGUFKernels, KernelUnavailable
from hetspec.workers.kernels.gguf_kernels import load as load_kernels
from hetspec.workers.kernels.gguf_tensors import GGUFTensor, read_tensors
from hetspec.workers.target.packed_linear import PackedLinear, onednn_available

# Windows up to this many tokens read the blocks; longer inputs (prompts) are bound by arithmetic
# and go to oneDNN's blocked kernels. The kernel reads the weights once per 8 rows, and was still
# ahead of oneDNN at 24 (measured: e7e822d:docs/kernels.md).
MAX_ROWS = 24
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj$")
_GGUF_NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
               "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


class GGUFLinear(torch.nn.Module):
    """y = x W^T + b with W read from its GGUF blocks for up to MAX_ROWS rows."""

    def __init__(self, linear: torch.nn.Linear, kernels: GGUFKernels, fmt: str, blocks: np.ndarray):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernels, self.fmt, self.blocks = kernels, fmt, blocks
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.long_inputs = PackedLinear(linear) if onednn_available() else linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > MAX_ROWS or x.dtype != torch.float32:
            return self.long_inputs(x)
        y = self.kernels.matmul(self.fmt, x.reshape(rows, self.in_features), self.blocks, self.out_features)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def use_gguf_blocks(lm: torch.nn.Module, model: ModelSpec, dtype: str) -> tuple[bool, str]:
    """Let a CPU target's verify windows read its GGUF file's blocks: (whether any
    layer does, what was swapped or why nothing was; "" for a target not from a
    GGUF file)."""
    if model.kind != "gguf":
        return False, ""
    if dtype != "float32":
        return False, f"no GGUF blocks (a {dtype} target does not hold the blocks' values)"
    try:
        kernels = load_kernels(os.path.dirname(model.cache_dir) if model.cache_dir else "")
    except KernelUnavailable as exc:
        return False, f"no GGUF blocks ({exc})"
    swapped = attach_gguf_blocks(lm, model.file, kernels)
    if not swapped:
        return False, f"no GGUF blocks (no layer holds exactly the values of a {', '.join(FORMATS)} tensor)"
    layers = ", ".join(f"{n} {fmt}" for fmt, n in sorted(swapped.items()))
    longer = "onednn prepacked" if onednn_available() else "torch"
    return True, f"GGUF blocks for windows of up to {MAX_ROWS} tokens, {longer} beyond ({layers} linear layers)"


def attach_gguf_blocks(model: torch.nn.Module, gguf_path: str, kernels: GGUFKernels) -> dict[str, int]:
    """Swap in a GGUFLinear for every float32 CPU linear layer whose weights are
    exactly a supported block tensor of the file; returns {format: layers}."""
    tensors = read_tensors(gguf_path)
    swapped: dict[str, int] = {}
    for name, module in list(model.named_modules()):
        if type(module) is not torch.nn.Linear or module.weight.dtype != torch.float32:
            continue
        if module.weight.device.type != "cpu":
            continue
        tensor = tensors.get(_gguf_name(name, tensors))
        if tensor is None or tensor.type_name not in FORMATS:
            continue
        fmt = tensor.type_name
        blocks = _blocks_in_model_order(module.weight.detach().numpy(), tensor)
        if blocks is None:
            continue
        swap = GGUFLinear(module, kernels, fmt, blocks)
        if not _agrees(module, swap):
            continue
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, swap)
        swapped[fmt] = swapped.get(fmt, 0) + 1
    return swapped


def _gguf_name(module_name: str, tensors: dict) -> str:
    """transformers' name of a llama-style linear layer -> the GGUF tensor's."""
    if module_name == "lm_head":           # an untied head is "output"; a tied one is the embedding
        return "output.weight" if "output.weight" in tensors else "token_embd.weight"
    match = _LAYER.match(module_name)
    return f"blk.{match[1]}.{_GGUF_NAMES[match[2]]}.weight" if match else ""


def _blocks_in_model_order(weight: np.ndarray, tensor: GGUFTensor) -> np.ndarray | None:
    """The tensor's block rows ordered as the model's weight rows, when the weights
    are exactly the blocks' values; None otherwise. transformers reorders the rows
    of llama's q and k projections (GGUF stores them permuted for its rotary
    embedding), hence the row matching."""
    import gguf

    rows, cols = weight.shape
    raw = tensor.data
    if raw is None or tensor.shape[0] != cols or raw.shape[0] != rows:
        return None
    values = gguf.quants.dequantize(np.asarray(raw), gguf.GGMLQuantizationType(tensor.ggml_type))
    values = values.reshape(rows, cols).astype(np.float32)
    if np.array_equal(values.view(np.int32), weight.view(np.int32)):
        return np.array(raw)                   # a copy: the model must not hang on the file's mapping
    where = {values[i].tobytes(): i for i in range(rows)}
    order = [where.get(weight[i].tobytes(), -1) for i in range(rows)]
    if -1 in order:
        return None
    return np.ascontiguousarray(raw[np.asarray(order)])


@torch.inference_mode()
def _agrees(linear: torch.nn.Linear, swapped: GGUFLinear) -> bool:
    """One probe window through both paths, within float32 rounding."""
    x = torch.randn(MAX_ROWS, linear.in_features, generator=torch.Generator().manual_seed(0))
    want, got = F.linear(x, linear.weight, linear.bias), swapped(x)
    return bool(torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())))
