"""Attention for grouped-query models that never copies keys and values per query head.

Given a mask, transformers' SDPA path repeats each KV head once for every query head
of its group (repeat_kv) before attending, on every version hetspec meets: at a static
cache's capacity and 64 requests' rows, gigabytes a layer. Here a group's query heads
are stacked as rows of one query instead, (batch, kv_heads, groups x tokens, head_dim),
against the KV head they share, the mask repeated over the stacked rows: the same
products for every query, keys and values read once. A mask already of groups x tokens
rows (captured.py builds it once a pass) is taken as it is.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "hetspec_grouped"


def grouped_rows(groups: int, mask: torch.Tensor) -> torch.Tensor:
    """A (batch, 1, tokens, keys) mask for the stacked query rows: row g x tokens + i is token i's."""
    return mask.repeat(1, 1, groups, 1)


def grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query (batch, heads, tokens, head_dim), key and value (batch, kv_heads, keys, head_dim):
    the output (batch, tokens, heads, head_dim), as sdpa_attention_forward gives it."""
    b, heads, tokens, dim = query.shape
    groups = heads // key.shape[1]
    if attention_mask is None or groups == 1:        # no mask: SDPA shares the heads itself (enable_gqa)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    mask = attention_mask[..., :key.shape[-2]]
    if mask.shape[-2] != groups * tokens:
        mask = grouped_rows(groups, mask)
    q = query.reshape(b, key.shape[1], groups * tokens, dim)     # head j x groups + g: kv head j, rows g x tokens...
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.view(b, heads, tokens, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_grouped_attention(lm) -> bool:
    """The model's attention made grouped_attention, where it runs SDPA over grouped heads."""
    config = lm.config.get_text_config()
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if heads == kv_heads or config._attn_implementation != "sdpa" or getattr(config, "attn_logit_softcapping", None):
        return False
    config._attn_implementation = NAME
    if lm.config is not config:
        lm.config._attn_implementation = NAME
    return True
