"""Call the GGUF block kernels (gguf_kernels.c beside this file), built for
this CPU by build.py; without them the target keeps oneDNN's kernels.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch

from hetspec.workers.kernels.build import KernelUnavailable, built, kernel_source
from hetspec.workers.kernels.formats import KERNEL_FORMATS as FORMATS

__all__ = ["FORMATS", "GGUFKernels", "KernelUnavailable", "load"]

SOURCE = kernel_source("gguf_kernels.c")


class GGUFKernels:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.lib.hs_gguf_matmul.restype = ctypes.c_int
        self.lib.hs_gguf_matmul.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                            ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]

    def matmul(self, fmt: str, x: torch.Tensor, blocks: np.ndarray, n: int) -> torch.Tensor:
        """x (T, K) float32 times the N x K weights held in `blocks`: (T, N)."""
        x = x.contiguous()
        y = torch.empty(x.shape[0], n, dtype=torch.float32)
        status = self.lib.hs_gguf_matmul(FORMATS[fmt].code, x.data_ptr(), x.shape[0], x.shape[1],
                                         blocks.ctypes.data, n, y.data_ptr())
        if status != 0:
            raise ValueError(f"GGUF kernel refused a {fmt} product of {tuple(x.shape)} by {n} rows")
        return y


@functools.cache
def load(cache_root: str = "") -> GGUFKernels:
    """The kernels, built into cache_root/kernels (or a temporary directory when
    there is no cache), once per process; KernelUnavailable says why they cannot be had here."""
    with built(SOURCE, "GGUF kernels", cache_root) as path:
        return GGUFKernels(path)       # loaded: a temporary file may go
