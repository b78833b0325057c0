"""What code driving llama.cpp's C API shares: one batch decoded, and freeing what it allocated."""
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


def decode(ctx, batch, tokens, pos: int, last_only: bool) -> None:
    """Evaluate `tokens` at positions pos.. of sequence 0 in one llama_decode call, with
    logits for every token or only the last."""
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = t, pos + i, 1, 0
        batch.logits[i] = not last_only or i == len(tokens) - 1
    batch.n_tokens = len(tokens)
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError(f"llama_decode failed at positions {pos}..{pos + len(tokens) - 1}")
