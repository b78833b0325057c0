"""Whether a GPU driver is present, asked without importing torch (seconds to import, and a
target on the CPU never uses it): the config places processes on cores by it, and the
target worker asks torch only where it is true (workers/target/devices.py)."""
from __future__ import annotations

import os

GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")    # NVIDIA's, WSL's, ROCm's


def gpu_driver_present() -> bool:
    return any(os.path.exists(node) for node in GPU_DEVICE_NODES)
