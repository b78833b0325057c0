"""Which device a target runs on: `auto` asks for CUDA without importing torch where no
GPU driver is present (importing it takes seconds, and a GGUF target on the CPU never uses it)."""
from __future__ import annotations

import os

GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def resolve_device(configured: str) -> str:
    if configured == "auto":
        return "cuda" if cuda_available() else "cpu"
    if configured.startswith("cuda") and not cuda_available():
        raise RuntimeError(f"device {configured!r} was configured but CUDA is not available")
    return configured


def cuda_available() -> bool:
    """torch's answer, asked only where a GPU driver's device is present (NVIDIA's, WSL's or ROCm's)."""
    if not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return False
    import torch

    return torch.cuda.is_available()
