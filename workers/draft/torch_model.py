"""A transformers model as the draft (any checkpoint; see workers/draft/backends.py)."""
from __future__ import annotations

import numpy as np

from hetspec.ipc.specs import ModelSpec
from hetspec.workers.common.hf_loading import load_causal_lm
from hetspec.workers.common.kv_model import KVModel


class TorchDraftModel:
    def __init__(self, model: ModelSpec, dtype: str = "float32", device: str = "cpu"):
        self.kv = KVModel(load_causal_lm(model, dtype, device), device)
        self.n_vocab = self.kv.n_vocab

    def forward(self, tokens, pos: int) -> np.ndarray:
        return self.kv.forward(tokens, pos, all_logits=False)[-1].cpu().numpy()

    def kv_geometry(self) -> list[int]:
        return []        # its cache is never replaced by the target's

    def import_kv(self, keys: np.ndarray, values: np.ndarray) -> None:
        raise NotImplementedError("a torch draft computes its own prompt cache")

    def set_threads(self, n_threads: int) -> None:
        import torch

        torch.set_num_threads(n_threads)

    def close(self) -> None:
        self.kv = None
