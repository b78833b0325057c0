"""What the llama.cpp-backed draft and target share: freeing what llama.cpp allocated."""
from __future__ import annotations

import llama_cpp


def free(batch, ctx, model) -> None:
    """Free a batch, a context and a model, any of them None (not allocated, or freed)."""
    if batch is not None:
        llama_cpp.llama_batch_free(batch)
    if ctx:
        llama_cpp.llama_free(ctx)
    if model:
        llama_cpp.llama_model_free(model)
