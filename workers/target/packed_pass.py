"""One transformers pass over several requests' windows, each against its own KV cache.

The windows' tokens run packed in one row, (1, N): every linear layer reads its
weights once for all of them, which is what a batch gains. Attention runs a request
at a time, over that request's own cache, with the mask the model would build for
it alone (made by transformers' own mask functions before the pass, from the
request's cache and positions). Two pieces let an unmodified model do that:

- Packed, handed to the model as its cache: its update() gives each request's
  slice of the new keys and values to that request's cache, and returns what each
  cache returns, as Slices;
- attend(), registered as an attention function and switched on for the pass
  only: it attends each request's slice of the queries to its Slices.

Rotary positions come per token (position_ids), so each request's tokens sit at
their own positions. A request's rows are the numbers its pass alone computes, up
to the last bits of a product over more rows (as a longer window's are).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hetspec.workers.common.hf_compat import alone_mask

NAME = "hetspec_packed"


class Slices(tuple):
    """Each request's keys (or values), as its own cache returned them; `packed` is the pass."""
    packed: Packed


class Packed:
    """The pass's cache: requests' caches side by side, each over its slice of the row."""

    def __init__(self, caches: list, bounds: list[tuple[int, int]], masks: list[dict], base: str, layer_types: list[str]):
        self.caches, self.bounds, self.masks = caches, bounds, masks
        self.base, self.layer_types = base, layer_types

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        pairs = [cache.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx, *args, **kwargs)
                 for cache, (a, b) in zip(self.caches, self.bounds)]
        keys, values = Slices(k for k, _ in pairs), Slices(v for _, v in pairs)
        keys.packed = values.packed = self
        return keys, values


def attend(module, query: torch.Tensor, key: Slices, value: Slices, attention_mask, **kwargs):
    """Each request's queries (1, heads, its tokens, head_dim) against its own keys and
    values, by the model's own attention function; outputs (1, N, heads, head_dim)."""
    packed = key.packed
    base = ALL_ATTENTION_FUNCTIONS.get_interface(packed.base, sdpa_attention_forward)
    kind = packed.layer_types[module.layer_idx]
    outs = [base(module, query[:, :, a:b], k, v, masks[kind], **kwargs)[0]
            for (a, b), k, v, masks in zip(packed.bounds, key, value, packed.masks)]
    return torch.cat(outs, dim=1), None


AttentionInterface.register(NAME, attend)


def masks_alone(lm, cache, n: int, pos: int, device: torch.device, layer_types: list[str]) -> dict:
    """The masks a pass of n tokens at pos over `cache` alone would be given, by layer kind
    (None where the attention function needs none: its own causal flag)."""
    config = lm.config.get_text_config()
    embeds = torch.empty((1, n, 1), dtype=lm.dtype, device=device)     # only its shape, dtype and device are read
    positions = torch.arange(pos, pos + n, device=device).view(1, -1)
    return {kind: alone_mask(kind, config, embeds, cache, positions) for kind in set(layer_types)}


@torch.inference_mode()
def packed_logits(lm, cache_arg: str, caches: list, windows: list[tuple[list[int], int, int]],
                  device: torch.device, layer_types: list[str]) -> list[torch.Tensor]:
    """Each window's (tokens, pos, rows): the float32 logits of its last `rows` tokens,
    run after its cache's first pos positions, all in one pass."""
    bounds, ends = [], 0
    for tokens, _, _ in windows:
        bounds.append((ends, ends + len(tokens)))
        ends += len(tokens)
    config = lm.config
    masks = [masks_alone(lm, cache, len(tokens), pos, device, layer_types)
             for cache, (tokens, pos, _) in zip(caches, windows)]
    packed = Packed(caches, bounds, masks, config._attn_implementation, layer_types)
    ids = torch.as_tensor([t for tokens, _, _ in windows for t in tokens], dtype=torch.long, device=device).view(1, -1)
    positions = torch.as_tensor([p for tokens, pos, _ in windows for p in range(pos, pos + len(tokens))],
                                dtype=torch.long, device=device).view(1, -1)
    keep = torch.as_tensor([i for (_, b), (_, _, rows) in zip(bounds, windows) for i in range(b - rows, b)],
                           device=device)
    placeholder = torch.zeros((1, 1, 1, 1), dtype=torch.bool, device=device)   # a 4D mask: the model makes none
    base, config._attn_implementation = config._attn_implementation, NAME
    try:
        logits = lm(input_ids=ids, position_ids=positions, attention_mask=placeholder, use_cache=True,
                    logits_to_keep=keep, **{cache_arg: packed}).logits[0].float()
    finally:
        config._attn_implementation = base
    rows = [rows for _, _, rows in windows]
    return list(torch.split(logits, rows))


def forward_batch(kv, windows: list[tuple]) -> list[torch.Tensor]:
    """A KV model's (kv_model.py, not captured) passes over several of its caches in one:
    each window's (cache, tokens, keep, rows), the float32 logits of its last rows."""
    caches = []
    for cache, tokens, keep, _ in windows:
        kv.use(cache)
        kv.prepare(tokens, keep)
        caches.append(kv.cache)
    logits = packed_logits(kv.lm, kv.cache_arg, caches, [window[1:] for window in windows], kv.device, kv.layer_types())
    for cache, tokens, keep, _ in windows:
        kv.use(cache)
        kv.length = keep + len(tokens)
    return logits
