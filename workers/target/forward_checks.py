"""The checks of a GGUF target's forward arguments, shared by its two backends
(native_target.py, llama_target.py): a module of its own, so that the native one
imports nothing of llama.cpp's."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def checked_window(target, cache: int, tokens: Sequence[int], keep: int, rows: int) -> np.ndarray:
    """A GGUF target's forward arguments, checked (ValueError naming the problem): the
    token ids as int64. target has caches, lengths, n_ctx and n_vocab."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n = ids.size
    if not 0 <= cache < target.caches:
        raise ValueError(f"cache {cache} is not one of the {target.caches} this target has")
    if n == 0 or not 1 <= rows <= n:
        raise ValueError(f"forward needs tokens and 1..{n} rows, got {n} tokens and {rows} rows")
    if not 0 <= keep <= target.lengths[cache] or keep + n > target.n_ctx:
        raise ValueError(f"positions {keep}..{keep + n - 1} do not follow the {target.lengths[cache]} cached "
                         f"or do not fit in {target.n_ctx}")
    if ids.min() < 0 or ids.max() >= target.n_vocab:
        raise ValueError(f"token ids must be in [0, {target.n_vocab})")
    return ids
