"""Build and call the GGUF block kernels (workers/gguf_kernels.c).

The C file is compiled on first use with the machine's C compiler (`CC`, else
`cc`) for the machine's own CPU, and the library is kept in the cache
directory under a name made from the source, the compiler and the CPU, so a
change of any of them builds afresh. Without a compiler, or on a CPU without
AVX2/FMA/F16C, `load` says why and the target keeps oneDNN's kernels.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import numpy as np
import torch

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_kernels.c")
FLAGS = ["-O3", "-march=native", "-std=c11", "-shared", "-fPIC"]
FORMATS = {"Q8_0": (0, 34), "Q4_0": (1, 18), "Q4_1": (2, 20)}   # name: (code in the C file, bytes per block)


class KernelUnavailable(RuntimeError):
    pass


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
        status = self.lib.hs_gguf_matmul(FORMATS[fmt][0], x.data_ptr(), x.shape[0], x.shape[1],
                                         blocks.ctypes.data, n, y.data_ptr())
        if status != 0:
            raise ValueError(f"GGUF kernel refused a {fmt} product of {tuple(x.shape)} by {n} rows")
        return y


def load(cache_root: str = "") -> GGUFKernels:
    """The kernels, built into cache_root/kernels (or a temporary directory when
    there is no cache); KernelUnavailable says why they cannot be had here."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise KernelUnavailable(f"no GGUF kernels for {platform.machine()} CPUs")
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C compiler ({compiler!r}) to build the GGUF kernels")
    key = _build_key(compiler)
    if cache_root:
        folder = os.path.join(cache_root, "kernels")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"gguf_kernels-{key}.so")
        if not os.path.isfile(path):
            _compile(compiler, folder, path)
        return GGUFKernels(path)
    with tempfile.TemporaryDirectory(prefix="hetspec-kernels-") as folder:
        path = os.path.join(folder, "gguf_kernels.so")
        _compile(compiler, folder, path)
        return GGUFKernels(path)       # loaded: the file may go


def _compile(compiler: str, folder: str, path: str) -> None:
    """Into a private name, then renamed: a reader never loads half a library."""
    partial = os.path.join(folder, f".partial-{os.getpid()}.so")
    try:
        done = subprocess.run([compiler, *FLAGS, SOURCE, "-o", partial], check=False, capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise KernelUnavailable(f"building the GGUF kernels failed: {done.stderr.strip()[-300:]}")
        os.replace(partial, path)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelUnavailable(f"building the GGUF kernels failed: {exc}") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _build_key(compiler: str) -> str:
    digest = hashlib.sha256()
    with open(SOURCE, "rb") as f:
        digest.update(f.read())
    digest.update(" ".join([compiler, *FLAGS]).encode())
    try:
        digest.update(subprocess.run([compiler, "--version"], check=False, capture_output=True, timeout=30).stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    digest.update(_cpu_flags().encode())
    return digest.hexdigest()[:16]


def _cpu_flags() -> str:
    """-march=native builds for this CPU: a cache shared with another kind of CPU must not reuse it."""
    seen = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.partition(":")[0].strip()
                if key in ("model name", "flags") and key not in seen:
                    seen[key] = line
    except OSError:
        pass
    return "".join(seen.values()) or platform.processor()
