"""Grouped-query attention that never repeats keys and values (workers/target/attention.py):
the outputs of transformers' own SDPA path, which repeats them; a grouped model's static
and captured passes, alone and in batches, computing what its growing cache does; and the
recordings' ladders bounded as the GPU target's start-up needs (captured.py)."""
import types

import numpy as np
import pytest
import torch
from transformers.integrations.sdpa_attention import repeat_kv

from hetspec.workers.common.kv_model import KVModel, padded_sizes
from hetspec.workers.target.attention import grouped_attention, grouped_rows, use_grouped_attention
from hetspec.workers.target.captured import GRAPHS_PER_SIZE, CapturedKVModel, outputs_bytes, row_counts, spans

from helpers import load_reference

GROUPED = ["random:kv_heads=2,seed=3", "random:arch=gemma3,window=8,layers=4,kv_heads=1,seed=3"]


@pytest.mark.parametrize("groups", [2, 4])
def test_grouped_attention_is_attention_over_repeated_heads(groups):
    gen = torch.Generator().manual_seed(groups)
    query, key, value = (torch.randn(shape, generator=gen) for shape in [(2, 8, 5, 16)] + [(2, 8 // groups, 40, 16)] * 2)
    mask = torch.rand((2, 1, 5, 40), generator=gen) > 0.3
    mask[..., 0] = True                                        # every query sees a key
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask, scale=0.3).transpose(1, 2)
    for given in (mask, grouped_rows(groups, mask)):          # as transformers builds it, and pre-stacked
        got, _ = grouped_attention(module, query, key, value, given, scaling=0.3)
        assert got.shape == (2, 5, 8, 16)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", GROUPED)
def test_a_grouped_models_captured_passes_compute_what_its_growing_cache_does(spec):
    """Prompts, lone windows with rollbacks, and batches of two and three, through the
    grouped attention (pre-stacked masks in the recorded pass), against the model's own
    attention over a growing cache."""
    lm = load_reference(spec)
    assert use_grouped_attention(lm)
    captured, growing = CapturedKVModel(lm, "cpu", 96, 9, caches=3), KVModel(load_reference(spec))
    assert captured._groups > 1
    rng, lengths = np.random.default_rng(1), [0, 0, 0]
    for step in range(14):
        caches = [c for c in range(3) if (step + c) % 4] if step > 2 else [step]
        windows = []
        for cache in caches:
            n = 20 if lengths[cache] == 0 else 1 + (step * 3 + cache) % 9
            keep = max(0, lengths[cache] - (step + cache) % 3)
            windows.append((cache, rng.integers(1, 300, n).tolist(), keep, min(n, 1 + cache)))
        got = captured.forward_batch(windows) if len(windows) > 1 else None
        for i, (cache, tokens, keep, rows) in enumerate(windows):
            growing.use(cache)
            want = growing.forward(tokens, keep)[-rows:]
            if got is None:
                captured.use(cache)
                have = captured.forward(tokens, keep)[-rows:]
            else:
                have = got[i]
            assert torch.equal(have.argmax(-1), want.argmax(-1)), (step, cache)
            torch.testing.assert_close(have, want, atol=1e-4, rtol=1e-4)
            lengths[cache] = keep + len(tokens)
    assert max(lengths) > 40 and any(key[1] == captured.spans[-1] for key in captured._recorded)


def test_start_up_records_at_most_eight_recordings_a_size_whose_outputs_are_small_beside_the_caches():
    """The default settings (64 caches, 4,096 positions, windows of up to 33): at most
    GRAPHS_PER_SIZE recordings a padded size, at any cache count; and for a 7B shape of a
    152k vocabulary (Qwen2.5-7B: 28 layers, 4 KV heads of 128, hidden 3,584, bfloat16) their
    outputs under 1% of what its 64 caches hold."""
    for caches in range(1, 257):
        counts = row_counts(caches)
        assert counts[0] == 1 and counts[-1] == caches and len(counts) * len(spans(4162, len(counts))) <= GRAPHS_PER_SIZE
    sizes = padded_sizes(33)
    capacity = 4096 + 33 + sizes[-1]
    caches_bytes = 64 * 2 * 28 * 4 * 128 * capacity * 2
    assert outputs_bytes(64, capacity, sizes, 3584, 2) < 0.01 * caches_bytes
    model = CapturedKVModel(load_reference("random:seed=3"), "cpu", 4096 + 33, 33, caches=64)
    model.record_all()
    assert len(model._recorded) <= GRAPHS_PER_SIZE * len(sizes)
    assert model.row_counts == (1, 4, 16, 64) and model.spans == (1088, 4224)
    assert "56 recordings shared by every cache" in model.describe()
