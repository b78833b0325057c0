"""A transformers causal LM behind a position-indexed KV cache.

forward(tokens, pos) drops every cached position >= pos and runs `tokens`
there, so rolling back after a rejection costs a cache crop, never a re-run
of the prefix. The cache is built without the model config, so every layer,
Gemma 3's sliding-window ones included, keeps its whole past and can be
cropped to any position; the attention mask still applies the window. (A
sliding layer of a config-built cache can only roll back what was added since
its last crop, which the draft's branch rewinds exceed.)
"""
from __future__ import annotations

import torch

from hetspec.workers.common.hf_compat import cache_keyword


class KVModel:
    def __init__(self, lm, device: str = "cpu"):
        self.lm = lm
        self.device = torch.device(device)
        self.n_vocab = int(lm.config.get_text_config().vocab_size)
        self.length = 0
        self.cache = None
        self.number = 0               # which cache forward() works on: each admitted request has one
        self.cache_arg = cache_keyword(lm)
        self._kept: dict[int, tuple] = {}   # the others' (cache, length)

    def use(self, number: int) -> None:
        """Work on cache `number` from now on; the current one is kept as it is."""
        if number != self.number:
            self._kept[self.number] = (self.cache, self.length)
            self.cache, self.length = self._kept.pop(number, (None, 0))
            self.number = number

    def forget(self) -> None:
        """Drop the current cache (after a failed pass it may be half written)."""
        self.cache, self.length = None, 0

    @staticmethod
    def _new_cache():
        from hetspec.workers.common.kv_cache import growing_cache

        return growing_cache()

    def layer_types(self) -> list[str]:
        config = self.lm.config.get_text_config()
        return list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)

    def geometry(self) -> list[int]:
        """[layers, kv_heads, head_dim, full-attention layers] of the cache as
        layer_kv hands it over; [] when some layers attend in another way."""
        config = self.lm.config.get_text_config()
        types = self.layer_types()
        if set(types) - {"full_attention", "sliding_attention"}:
            return []
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return [len(types), getattr(config, "num_key_value_heads", None) or heads, head_dim,
                types.count("full_attention")]

    def layer_kv(self, length: int):
        """(keys, values) of each layer's first `length` positions, (kv_heads, length, head_dim):
        the full-attention layers first, then the sliding-window ones (as llama.cpp
        keeps them in two caches), each in model order."""
        if length > self.length:
            raise ValueError(f"{length} positions asked for, {self.length} cached")
        types = self.layer_types()
        order = sorted(range(len(types)), key=lambda i: types[i] != "full_attention")
        for i in order:
            layer = self.cache.layers[i]
            yield layer.keys[0, :, :length], layer.values[0, :, :length]

    def _check(self, tokens, pos: int) -> None:
        """ValueError unless tokens can run at pos."""
        if len(tokens) == 0:
            raise ValueError("forward needs at least one token")
        if pos > self.length or pos < 0:
            raise ValueError(f"position {pos} is beyond the {self.length} cached tokens")

    def prepare(self, tokens, pos: int) -> None:
        """The current cache made ready for tokens at pos: new, or cropped to pos."""
        self._check(tokens, pos)
        if pos == 0 or self.cache is None:
            self.cache = self._new_cache()
        elif pos < self.length:
            self.cache.crop(pos - self.length)

    @torch.inference_mode()
    def forward(self, tokens, pos: int, all_logits: bool = True) -> torch.Tensor:
        """Logits (n, vocab) for every token (or only the last one), float32."""
        self.prepare(tokens, pos)
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).view(1, -1)
        out = self.lm(input_ids=ids, use_cache=True, logits_to_keep=0 if all_logits else 1,
                      **{self.cache_arg: self.cache})
        self.length = pos + len(tokens)
        return out.logits[0].float()


def padded_sizes(max_window: int) -> tuple[int, ...]:
    """The lengths a static cache's passes are padded to: the powers of two below
    max_window (a verify window: the budget's largest plus one), then max_window."""
    sizes = [1]
    while 2 * sizes[-1] < max_window:
        sizes.append(2 * sizes[-1])
    return tuple(sizes) + ((max_window,) if max_window > 1 else ())


class StaticKVModel(KVModel):
    """The same behind static caches: each request's allocated once, for its whole context
    (transformers' StaticLayer, every layer full length so any rollback works; the mask
    applies a sliding window), a rollback moving a length kept on the device, and every
    pass of up to max_window tokens padded to one of padded_sizes with its ids in a
    preallocated device buffer: a handful of fixed shapes at fixed addresses, what a
    captured pass (CUDA graphs, torch.compile) needs. The padding sits after the window,
    where the causal mask hides it, and the next pass overwrites it; a longer pass (a
    prompt) runs as it is. (workers/target/captured.py records these passes.)"""

    def __init__(self, lm, device: str, n_ctx: int, max_window: int):
        super().__init__(lm, device)
        self.sizes = padded_sizes(max_window)
        self.n_ctx = n_ctx
        self.capacity = n_ctx + self.sizes[-1]            # room for the last window's padding
        self._ids = torch.zeros((1, self.sizes[-1]), dtype=torch.long, device=self.device)

    def _new_cache(self):
        from transformers.cache_utils import Cache, StaticLayer

        return Cache(layers=[StaticLayer(self.capacity) for _ in self.layer_types()])

    def _rewind(self, pos) -> None:
        """Every layer's length to pos (an int, or a device scalar): where this pass
        writes. A rollback is this, and so is dropping the last pass's padding."""
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(pos) if torch.is_tensor(pos) else layer.cumulative_length.fill_(pos)

    def _size(self, tokens, pos: int) -> int:
        """The padded length of a pass of tokens at pos (its own past the largest size)."""
        self._check(tokens, pos)
        if pos + len(tokens) > self.n_ctx:
            raise ValueError(f"{pos + len(tokens)} positions do not fit the cache's {self.n_ctx}")
        if self.cache is None:
            self.cache = self._new_cache()                 # once per request: later passes reuse it
        return next((s for s in self.sizes if s >= len(tokens)), len(tokens))

    @torch.inference_mode()
    def prepare(self, tokens, pos: int) -> None:
        self._size(tokens, pos)
        self._rewind(pos)

    @torch.inference_mode()
    def forward(self, tokens, pos: int, all_logits: bool = True) -> torch.Tensor:
        size, n = self._size(tokens, pos), len(tokens)
        self._rewind(pos)
        if n <= self.sizes[-1]:
            ids = self._ids[:, :size]
            ids[0, :n] = torch.as_tensor(tokens, dtype=torch.long)
            ids[0, n:] = 0                                 # any token: its positions come after the window's
        else:
            ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).view(1, -1)
        keep = 0 if all_logits or size > n else 1
        out = self.lm(input_ids=ids, use_cache=True, logits_to_keep=keep, **{self.cache_arg: self.cache})
        self.length = pos + n
        logits = out.logits[0, :n]                         # the window's rows, not its padding's
        return (logits if all_logits else logits[-1:]).float()
