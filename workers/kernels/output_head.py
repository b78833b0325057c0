"""The Q8_0 output layer of a llama.cpp target, a window at once (output_head.c beside this file).

llama.cpp stops at its final norm (an eval callback copies "result_norm" out and ends
the graph there); this kernel then computes every row's logits with llama.cpp's own
Q8_0 arithmetic, reading each weight row once for the whole window.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from hetspec.workers.kernels.build import KernelUnavailable, built, kernel_source
from hetspec.workers.kernels.formats import BLOCK, KERNEL_FORMATS
from hetspec.workers.kernels.gguf_tensors import read_gguf

SOURCE = kernel_source("output_head.c")
MAX_TOKENS = 64         # output_head.c's MAX_TOKENS
MAX_COLS = 512 * BLOCK  # output_head.c's MAX_BLOCKS blocks


class _Capture(ctypes.Structure):
    """output_head.c's hs_capture."""
    _fields_ = [("name", ctypes.c_void_p), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("room", ctypes.c_size_t), ("got", ctypes.c_size_t),
                ("reached", ctypes.c_int)]


def head_matrix(path: str) -> tuple[np.ndarray | None, str]:
    """The file's output matrix as rows x bytes of Q8_0 blocks, or None and why not."""
    meta, tensors = read_gguf(path)
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    arch = meta.get("general.architecture", "")
    if head is None or head.type_name != "Q8_0":
        return None, f"its output layer is {head.type_name or 'another type' if head else 'missing'}, not Q8_0"
    if meta.get(f"{arch}.final_logit_softcapping"):
        return None, "it caps its logits"
    if head.shape[0] > MAX_COLS:
        return None, f"its rows are longer than {MAX_COLS}"
    return head.data, ""


@functools.cache
def library(cache_root: str = ""):
    """output_head.c, built here once (KernelUnavailable where it cannot be), hs_head_q8_0 typed;
    loaded once per process."""
    with built(SOURCE, "output-layer kernel", cache_root) as path:
        lib = ctypes.CDLL(path)
    lib.hs_head_q8_0.restype = ctypes.c_int
    lib.hs_head_q8_0.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_int]
    return lib


def head_logits(lib, weights: np.ndarray, cols: int, x: np.ndarray, n: int, out: np.ndarray, threads: int) -> None:
    """out (n, rows) = x's first n rows (of cols floats) times the Q8_0 rows `weights`."""
    if lib.hs_head_q8_0(weights.ctypes.data, weights.shape[0], cols, x.ctypes.data, n, out.ctypes.data, threads) != 0:
        raise RuntimeError(f"the output-layer kernel refused {n} rows of {cols}")


class OutputHead:
    """The kernel, the weights and the eval callback that feeds them; keep it alive as long
    as the llama.cpp context it was given to."""

    def __init__(self, weights: np.ndarray, cols: int, rows_a_pass: int, cache_root: str = ""):
        self._lib = library(cache_root)
        import llama_cpp

        ggml = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
        self.weights, self.cols = weights, cols
        self.norm = np.zeros((rows_a_pass, cols), dtype=np.float32)
        self._capture = _Capture(*(ctypes.cast(getattr(ggml, f), ctypes.c_void_p) for f in
                                   ("ggml_get_name", "ggml_get_data", "ggml_nbytes")),
                                 self.norm.ctypes.data, self.norm.nbytes, 0, 0)
        self.callback = ctypes.cast(self._lib.hs_capture_norm, llama_cpp.ggml_backend_sched_eval_callback)
        self.user_data = ctypes.cast(ctypes.pointer(self._capture), ctypes.c_void_p)

    def before_pass(self) -> None:
        self._capture.got = self._capture.reached = 0

    def reached(self) -> bool:
        """Whether the last pass stopped at the final norm (a graph without one runs whole)."""
        return bool(self._capture.reached)

    def logits(self, n: int, out: np.ndarray, threads: int) -> None:
        """The last pass's n output rows' logits into out (n, rows)."""
        if self._capture.got != n * self.cols * 4:
            raise RuntimeError(f"llama.cpp's final norm held {self._capture.got} bytes, not {n} rows of {self.cols}")
        head_logits(self._lib, self.weights, self.cols, self.norm, n, out, threads)


def load(path: str, rows_a_pass: int, cache_root: str = "") -> tuple[OutputHead | None, str]:
    """The output layer for a GGUF file, or None and why llama.cpp keeps its own."""
    weights, why = head_matrix(path)
    if weights is None:
        return None, why
    try:
        cols = weights.shape[1] // KERNEL_FORMATS["Q8_0"].block_bytes * BLOCK
        return OutputHead(np.ascontiguousarray(weights), cols, rows_a_pass, cache_root), ""
    except KernelUnavailable as exc:
        return None, str(exc)
    except (OSError, AttributeError) as exc:     # llama-cpp-python without ggml's library where we look
        return None, f"llama.cpp's ggml library was not found beside llama_cpp ({exc})"
