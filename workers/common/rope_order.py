"""Keys in the order llama.cpp's rope expects: how a transformers model's cache is handed
to a draft that runs the same weights from a GGUF file (the native model, llama.cpp)."""
from __future__ import annotations

import numpy as np

ROPE_NORM, ROPE_NEOX = 0, 2   # llama.cpp's rope types: adjacent pairs, or halves as in transformers


def to_llama_order(keys: np.ndarray, rope_type: int) -> np.ndarray:
    """Keys (layers, kv_heads, T, head_dim) as transformers keeps them, post-RoPE.

    GGUF conversion of a Llama permutes each head's query and key rows so that
    llama.cpp's rope, which turns adjacent pairs, equals transformers' rope over
    the two halves: dimension 2i + h of llama.cpp is dimension h * head_dim/2 + i
    of transformers. NEOX-rope models are converted without the permutation."""
    if rope_type == ROPE_NEOX:
        return keys
    if rope_type != ROPE_NORM:
        raise ValueError(f"llama.cpp rope type {rope_type} is not supported for a KV handover")
    layers, heads, t, d = keys.shape
    return keys.reshape(layers, heads, t, 2, d // 2).swapaxes(3, 4).reshape(layers, heads, t, d)
