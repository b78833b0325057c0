"""A transformers model as the draft: the same interface as LlamaCppModel."""
from __future__ import annotations

import numpy as np

from workers.hf_loading import load_causal_lm
from workers.kv_model import KVModel


class TorchDraftModel:
    def __init__(self, model: dict, dtype: str = "float32", device: str = "cpu"):
        self.kv = KVModel(load_causal_lm(model, dtype, device), device)
        self.n_vocab = self.kv.n_vocab

    def forward(self, tokens, pos: int) -> np.ndarray:
        return self.kv.forward(tokens, pos, all_logits=False)[-1].cpu().numpy()

    def set_threads(self, n_threads: int) -> None:
        import torch

        torch.set_num_threads(n_threads)

    def close(self) -> None:
        self.kv = None
