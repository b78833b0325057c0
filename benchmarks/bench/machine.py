"""The machine a run happened on: speedups only mean something next to it."""
from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import psutil

from hetspec.workers.kernels.build import ISAS, isa

PACKAGES = ("hetspec", "torch", "transformers", "llama_cpp_python", "numpy", "pyzmq")


def parse_isa(parser, argv):
    """The arguments, with --isa: the instruction set hetspec's kernels are built for (HETSPEC_ISA, which the engines
    this process starts inherit) and llama.cpp's binaries are picked by."""
    parser.add_argument("--isa", choices=sorted(ISAS), help="build hetspec's kernels for this instruction set and "
                        "compare with llama.cpp built for it (HETSPEC_ISA; default: native, everything this CPU has; "
                        "avx2: `scripts/build_llama_cpp.sh --isa avx2` builds llama.cpp's)")
    args = parser.parse_args(argv)
    if args.isa:
        os.environ["HETSPEC_ISA"] = args.isa
    return args


def affinity() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def cpu_isa() -> str:
    """The widest integer-product path this CPU offers: what `native` builds use."""
    flags = set(_cpuinfo("flags").split())
    if {"avx512bw", "avx512_vnni"} <= flags:
        return "AVX-512 VNNI"
    return "AVX2" if {"avx2", "fma", "f16c"} <= flags else "no AVX2"


def describe_machine(gpu: bool = True) -> dict:
    """gpu False: no probe (it imports torch: a second and more)."""
    built = isa()
    return {
        "hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
        "cpu": _cpuinfo("model name") or platform.processor() or "unknown",
        "isa": f"CPU with {cpu_isa()}; hetspec and llama.cpp built for "
               + (cpu_isa() if built == "native" else built.upper()),
        "logical_cores": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False), "affinity": affinity(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "packages": {name: _version(name) for name in PACKAGES},
        "git_commit": _git_commit(),
        "gpu": _gpu() if gpu else "not probed",
    }


def _cpuinfo(key: str) -> str:
    """The first /proc/cpuinfo line's value for `key` ("" where there is none)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), "")


def _version(name: str) -> str | None:
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(name)
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
