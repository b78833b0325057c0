"""The transformers calls whose signatures moved between the versions hetspec meets: the
floor setup.cfg states, the GPU image's (5.17) and the newest scripts/setup.sh installs.
Each difference is asked of the installed version here, once, and nowhere else
(tests/test_transformers_versions.py runs the target's tests on each)."""
from __future__ import annotations

import inspect

import torch


def cache_keyword(fn) -> str:
    """A forward's (or a mask function's) name for the KV cache: transformers 5.24 renamed
    past_key_values to cache (the old name warns there, and goes in 5.40)."""
    fn = getattr(fn, "forward", fn)
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


def alone_mask(kind: str, config, embeds: torch.Tensor, cache, positions: torch.Tensor):
    """The mask transformers builds for a pass over `cache` alone, for layers of `kind`
    ("full_attention" or "sliding_attention"; None where attention needs none)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    make = create_causal_mask if kind == "full_attention" else create_sliding_window_causal_mask
    return make(config=config, inputs_embeds=embeds, attention_mask=None, position_ids=positions,
                **{cache_keyword(make): cache})


def decoder(lm):
    """The model under the output layer: its final hidden states, normed."""
    return lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
