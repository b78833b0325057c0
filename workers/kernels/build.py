"""Build this package's C files for this machine's CPU, once.

A library (one C file, or several: the native model's) is compiled on first use
with the machine's C compiler (`CC`, else `cc`) for the instruction set that
`HETSPEC_ISA` names (ISAS: `native`, the default, everything this CPU has; `avx2`,
AVX2, FMA and F16C alone, the path of the CPUs without AVX-512), and kept in
the cache directory under a name made from its sources and the headers beside
them (formats.h), the compiler and the CPU, so a change of any of them builds afresh. Without a
compiler, or on a CPU the code is not written for, `built` says why and the
caller keeps its other kernels.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from contextlib import contextmanager

FLAGS = ["-O3", "-std=c11", "-shared", "-fPIC", "-pthread"]
# HETSPEC_ISA's values and their compiler flags: x86-64-v3 is AVX2, FMA, F16C and BMI2, no AVX-512 nor AVX-VNNI.
ISAS = {"native": ["-march=native"], "avx2": ["-march=x86-64-v3", "-mtune=native"]}
FOLDER = os.path.dirname(os.path.abspath(__file__))


def isa() -> str:
    """The instruction set the kernels are built for (HETSPEC_ISA); KernelUnavailable names an unknown one."""
    name = os.environ.get("HETSPEC_ISA", "").strip().lower() or "native"
    if name not in ISAS:
        raise KernelUnavailable(f"HETSPEC_ISA={name!r} is not one of {', '.join(ISAS)}")
    return name


def isa_flags() -> list[str]:
    """The compiler's flags for HETSPEC_ISA."""
    return [*FLAGS, *ISAS[isa()]]


def kernel_source(name: str) -> str:
    """The path of one of this package's C files."""
    return os.path.join(FOLDER, name)


class KernelUnavailable(RuntimeError):
    """The kernels cannot be had on this machine (another CPU, no C compiler): the engine falls
    back, and says why."""


class KernelBuildFailed(KernelUnavailable):
    """A compiler was there and the sources did not build: the engine still falls back, but the
    tests fail (a broken C file must not pass as a machine without kernels)."""


@contextmanager
def built(source: str | Sequence[str], what: str, cache_root: str = ""):
    """The path of `source` (a C file, or several built into one library, named
    for the first) built into cache_root/kernels (or a temporary directory,
    removed on leaving, when there is no cache); `what` names the kernels in
    errors. KernelUnavailable says why they cannot be had here."""
    sources = [source] if isinstance(source, str) else list(source)
    isa()                                   # an unknown HETSPEC_ISA says so before anything is built
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise KernelUnavailable(f"no {what} for {platform.machine()} CPUs")
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C compiler ({compiler!r}) to build the {what}")
    stem = os.path.splitext(os.path.basename(sources[0]))[0]
    if cache_root:
        folder = os.path.join(cache_root, "kernels")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{stem}-{_build_key(sources, compiler)}.so")
        if not os.path.isfile(path):
            _compile(sources, what, compiler, folder, path)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="hetspec-kernels-") as folder:
        path = os.path.join(folder, f"{stem}.so")
        _compile(sources, what, compiler, folder, path)
        yield path


def _compile(sources: list[str], what: str, compiler: str, folder: str, path: str) -> None:
    """Into a private name, then renamed: a reader never loads half a library."""
    partial = os.path.join(folder, f".partial-{os.getpid()}.so")
    try:
        done = subprocess.run([compiler, *isa_flags(), *sources, "-o", partial, "-lm"], check=False,
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise KernelBuildFailed(f"building the {what} failed: {done.stderr.strip()[-300:]}")
        os.replace(partial, path)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildFailed(f"building the {what} failed: {exc}") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _build_key(sources: list[str], compiler: str) -> str:
    """The C files, every header of their folder (they include them by a relative
    path), the compiler, its flags and the CPU."""
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(sources[0]))
    headers = sorted(name for name in os.listdir(folder) if name.endswith(".h"))
    for path in [*sources, *(os.path.join(folder, name) for name in headers)]:
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(" ".join([compiler, *isa_flags()]).encode())
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
