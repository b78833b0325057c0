"""A KV cache that grows in place instead of by concatenation.

transformers' DynamicLayer appends a pass's keys and values with torch.cat,
which copies the layer's whole past on every pass: a cost that grows with
the context (measured: e7e822d:docs/kernels.md), and memory traffic felt by the
draft on the neighbouring core. Here the states live in a buffer
with room to spare (doubled when full); keys and values are views of its
filled part, and a rollback only moves the fill mark. The values are the
same, so attention computes the same numbers.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_CAPACITY = 256


class GrowingLayer(DynamicLayer):
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._keys = self._values = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            self._grow(key_states, value_states, end)
        self._keys[..., self._length:end, :].copy_(key_states)
        self._values[..., self._length:end, :].copy_(value_states)
        self._set_length(end)
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        old = 0 if self._keys is None else self._keys.shape[-2]
        capacity = max(needed, 2 * old, MIN_CAPACITY)
        keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if self._length:
            keys[..., :self._length, :].copy_(self._keys[..., :self._length, :])
            values[..., :self._length, :].copy_(self._values[..., :self._length, :])
        self._keys, self._values = keys, values

    def _set_length(self, length: int) -> None:
        self._length = length
        self.keys = self._keys[..., :length, :]
        self.values = self._values[..., :length, :]

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes the number of tokens to remove as a negative number, got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized:
            self._set_length(max(0, self._length + tokens_to_remove))

    def reset(self) -> None:
        self._keys = self._values = None
        self._length = 0
        super().reset()


def growing_cache() -> Cache:
    """One GrowingLayer per attention layer, created as the model first uses each.
    Like DynamicCache without a config, every layer keeps its whole past, so a
    sliding-window layer can be rolled back anywhere (its mask applies the window)."""
    return Cache(layer_class_to_replicate=GrowingLayer)
