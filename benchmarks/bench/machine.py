"""The machine a run happened on: speedups only mean something next to it."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import psutil

from hetspec.workers.kernels.build import ISAS, isa

PACKAGES = ("hetspec", "torch", "transformers", "llama_cpp_python", "numpy", "pyzmq")


def add_isa_option(parser) -> None:
    """--isa: the instruction set hetspec's kernels are built for and llama.cpp's binaries picked by."""
    parser.add_argument("--isa", choices=sorted(ISAS), help="build hetspec's kernels for this instruction set and "
                        "compare with llama.cpp built for it (HETSPEC_ISA; default: native, everything this CPU has; "
                        "avx2: `scripts/build_llama_cpp.sh --isa avx2` builds llama.cpp's)")


def use_isa(name: str | None) -> None:
    """--isa's value for this process and the engines it starts (their workers build the kernels)."""
    if name:
        os.environ["HETSPEC_ISA"] = name


def cpu_isa() -> str:
    """The widest integer-product path this CPU offers: what `native` builds use."""
    flags = set(_cpu_flags().split())
    if {"avx512bw", "avx512_vnni"} <= flags:
        return "AVX-512 VNNI"
    return "AVX2" if {"avx2", "fma", "f16c"} <= flags else "no AVX2"


def isa_line() -> str:
    """For every report: what the CPU has and what this run's kernels were built for."""
    built = isa()
    return f"CPU with {cpu_isa()}; hetspec and llama.cpp built for " + (cpu_isa() if built == "native" else built.upper())


def describe_machine(gpu: bool = True) -> dict:
    """gpu False: no probe (it imports torch: a second and more)."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "isa": isa_line(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "packages": {name: _version(name) for name in PACKAGES},
        "git_commit": _git_commit(),
        "gpu": _gpu() if gpu else "not probed",
    }


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown"


def _cpu_flags() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    return next((line.split(":", 1)[1] for line in lines if line.startswith("flags")), "")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), *args], capture_output=True,
                              text=True, timeout=5, check=False).stdout.strip()

    try:
        commit, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}{'+dirty' if dirty else ''}" if commit else None


def _gpu() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken CUDA setup just means "no GPU" here
        return None
