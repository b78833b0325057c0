"""A draft that prefills long prompts with a second copy of its weights.

A prompt prefill is a batched product, bound by arithmetic; a draft step is
one row at a time, bound by reading the weights. The weight type llama.cpp
drafts fastest with is not the one it prefills fastest with (Q8_0 drafts
faster, BF16 prefills faster: measured, e7e822d:docs/kernels.md). So a fresh prompt
is prefilled by the second copy, and its KV state is handed to the drafting
copy (same architecture, same cache layout); greedy agreement with the
target is unchanged by the handover.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_PROMPT = 64   # shorter: the handover is not worth it


class SplitPrefillModel:
    def __init__(self, model, prefill_model, min_prompt: int = MIN_PROMPT):
        self.model = model
        self.prefill_model = prefill_model
        self.min_prompt = min_prompt
        self.n_vocab = model.n_vocab
        self.n_ctx = model.n_ctx

    def forward(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        """As the drafting model's forward. min_prompt tokens or more go through
        the prefill copy (given the cache before pos first), all but the last,
        whose logits the drafting copy computes after taking the cache back."""
        if len(tokens) < self.min_prompt:
            return self.model.forward(tokens, pos)
        if pos > 0:
            self.prefill_model.import_cache(self.model.export_cache(pos))
        last = pos + len(tokens) - 1
        self.prefill_model.forward(tokens[:-1], pos)
        self.model.import_cache(self.prefill_model.export_cache(last))
        return self.model.forward(tokens[-1:], last)

    def kv_geometry(self) -> list[int]:
        return self.model.kv_geometry()

    def import_kv(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.model.import_kv(keys, values)

    def set_threads(self, n_threads: int) -> None:
        self.model.set_threads(n_threads)
        self.prefill_model.set_threads(n_threads)

    def close(self) -> None:
        self.model.close()
        self.prefill_model.close()
