"""Which device a target runs on: `auto` asks for CUDA without importing torch where no
GPU driver is present (importing it takes seconds, and a GGUF target on the CPU never uses it)."""
from __future__ import annotations

from hetspec.core.devices import gpu_driver_present
from hetspec.core.running import CPU_RUNNING

GPU_MEMORY_SHARE = 0.5   # [server] max_running "auto" on CUDA: the requests whose caches, at full context, fill this share of the free memory


def running_caches(spec, device: str, cache_bytes: int = 0, reserved_bytes: int = 0) -> int:
    """The caches to keep (requests stepped together): spec.caches, or where [server]
    max_running is "auto" on CUDA (spec.fit_caches; spec.caches the most) as many as
    GPU_MEMORY_SHARE of the memory free after loading holds, less `reserved_bytes` (the
    recorded passes' outputs), a cache `cache_bytes` at full context; CPU_RUNNING where
    CUDA was expected (a driver present) and torch found none."""
    if not spec.fit_caches:
        return spec.caches
    if device.startswith("cuda") and cache_bytes:
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return max(1, min(spec.caches, int(GPU_MEMORY_SHARE * free - reserved_bytes) // cache_bytes))
    return min(spec.caches, CPU_RUNNING)


def resolve_device(configured: str) -> str:
    if configured == "auto":
        return "cuda" if cuda_available() else "cpu"
    if configured.startswith("cuda") and not cuda_available():
        raise RuntimeError(f"device {configured!r} was configured but CUDA is not available")
    return configured


def cuda_available() -> bool:
    """torch's answer, asked only where a GPU driver's device is present."""
    if not gpu_driver_present():
        return False
    import torch

    return torch.cuda.is_available()
