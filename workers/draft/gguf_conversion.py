"""Convert a draft GGUF to the weight type that llama.cpp runs fastest here.

The draft's speed is the ceiling of pipelined speculation, and which of
llama.cpp's kernels are fastest depends on the CPU and the weight type; the
fastest type is not always the one a file ships in, and the fastest of all
(Q4_0) costs agreement with the target (measured: e7e822d:docs/kernels.md). F16 of a
Q4_1 file holds its values exactly, so the draft then agrees with a target
dequantized from the same file at nearly every position. [draft] weights
chooses; "as-is" skips this.
"""
from __future__ import annotations

import ctypes
import os

import llama_cpp

FTYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
          "q6_k": "MOSTLY_Q6_K", "q5_k_m": "MOSTLY_Q5_K_M", "q4_k_m": "MOSTLY_Q4_K_M", "q4_1": "MOSTLY_Q4_1",
          "q4_0": "MOSTLY_Q4_0"}


def convert_gguf(source: str, weights: str, scratch_dir: str, threads: int = 1) -> str:
    """Write `source` converted to `weights` into scratch_dir and return its path;
    the caller loads it and removes it (llama.cpp keeps the weights in memory)."""
    if weights not in FTYPES:
        raise ValueError(f"unknown draft weight type {weights!r}; known: {', '.join(FTYPES)}")
    target = os.path.join(scratch_dir, f"draft-{weights}.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + FTYPES[weights])
    params.allow_requantize = True      # the source is usually quantized already
    params.nthread = max(1, threads)
    rc = llama_cpp.llama_model_quantize(os.fsencode(source), os.fsencode(target), ctypes.byref(params))
    if rc != 0 or not os.path.isfile(target):
        raise RuntimeError(f"llama.cpp could not convert {source} to {weights} (code {rc})")
    return target
