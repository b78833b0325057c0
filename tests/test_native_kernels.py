"""The native draft's matrix-vector product (workers/kernels/native_draft.c, hs_matvec)
against float64, for every block format it reads, with block counts that are
odd (a last 4-bit block without a partner for the two-block steps) and row
counts that do not fill its four-row tiles. The only error allowed is the one
of rounding the activations to int16 per block, plus float32 summation."""
import ctypes
import os
import shutil

import numpy as np
import pytest

from hetspec.workers.draft.native import FORMATS, SOURCE, _Mat
from hetspec.workers.kernels.build import KernelUnavailable, _build_key, built


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    try:
        with built(SOURCE, "native draft kernels", str(tmp_path_factory.mktemp("cache"))) as path:
            lib = ctypes.CDLL(path)
    except KernelUnavailable as exc:
        pytest.skip(str(exc))
    lib.hs_matvec_work_floats.restype = ctypes.c_long
    lib.hs_matvec_work_floats.argtypes = [ctypes.c_int]
    lib.hs_matvec.argtypes = [ctypes.POINTER(_Mat), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def random_matrix(fmt: str, rows: int, cols: int, rng):
    """(the C side's arrays, the weights they stand for in float64)."""
    nb = cols // 32
    d = (rng.standard_normal((rows, nb)) * 0.02).astype(np.float16)
    m = (rng.standard_normal((rows, nb)) * 0.02).astype(np.float16) if fmt == "Q4_1" else None
    if fmt == "Q8_0":
        q = rng.integers(-127, 128, (rows, nb, 32)).astype(np.int8)
        qs, values = q.view(np.uint8), q.astype(np.float64)
    else:   # byte j of a block holds value j (low nibble) and value j + 16 (high nibble)
        q = rng.integers(0, 16, (rows, nb, 32)).astype(np.uint8)
        qs = q[:, :, :16] | (q[:, :, 16:] << 4)
        values = q.astype(np.float64) - (8.0 if fmt == "Q4_0" else 0.0)
    weights = values * d.astype(np.float64)[:, :, None]
    if m is not None:
        weights += m.astype(np.float64)[:, :, None]
    arrays = [np.ascontiguousarray(qs.reshape(rows, -1)), d, m]
    return arrays, weights.reshape(rows, cols)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("rows, cols", [(7, 96), (12, 576), (5, 1568)])
def test_matvec_is_the_product_up_to_rounding_the_activations(library, fmt, rows, cols):
    rng = np.random.default_rng(cols + rows)
    (qs, d, m), weights = random_matrix(fmt, rows, cols, rng)
    mat = _Mat(qs.ctypes.data, d.ctypes.data, m.ctypes.data if m is not None else None, FORMATS[fmt], rows, cols)
    x = (rng.standard_normal(cols) * np.exp(rng.standard_normal(cols))).astype(np.float32)   # uneven blocks
    y = np.zeros(rows, np.float32)
    work = np.zeros(library.hs_matvec_work_floats(cols), np.float32)
    library.hs_matvec(ctypes.byref(mat), x.ctypes.data, y.ctypes.data, work.ctypes.data)

    want = weights @ x.astype(np.float64)
    # each activation is off by at most half a step of its block's int16 grid
    step = np.abs(x.reshape(-1, 32)).max(axis=1) / 32767
    rounding = (np.abs(weights).reshape(rows, -1, 32).sum(axis=2) * step / 2).sum(axis=1)
    summation = 1e-5 * np.abs(weights) @ np.abs(x.astype(np.float64))
    assert np.all(np.abs(y - want) <= rounding + summation), np.abs(y - want) / (rounding + summation)
    assert np.abs(y - want).max() > 0   # not vacuous: float32 and the rounding show


def test_a_changed_header_builds_afresh(tmp_path):
    """The cached library's name covers the headers the C file includes (formats.h)."""
    folder = tmp_path / "kernels"
    shutil.copytree(os.path.dirname(SOURCE), folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    source = str(folder / "native_draft.c")
    before = _build_key(source, "cc")
    assert _build_key(source, "cc") == before
    with open(folder / "formats.h", "a") as f:
        f.write("/* changed */\n")
    assert _build_key(source, "cc") != before
