"""The paper's setting: the target on a CUDA GPU, the draft on a CPU core. Skipped where
torch sees no GPU (CI has none); scripts/gpu_check.sh runs it on a GPU machine.

float32: greedy output equals the target's own `generate` on the same GPU, in every
mode. bfloat16: a window of tokens is one product, which rounds otherwise than one
token at a time, so the reference is the target's own batched pass over the output
(teacher-forced): each token is its argmax there, but at near-ties. Sampling keeps
the target's law. Concurrent requests batch, each with its output alone."""
import numpy as np
import pytest
import torch
from test_batch import REQUESTS
from test_engine_greedy import PROMPTS, SETTINGS
from test_turns import run_all

import hetspec

from helpers import (
    TARGET,
    WEAK_DRAFT,
    exact_joint,
    explain_mismatch,
    load_reference,
    random_engine_config,
    reference_greedy,
    total_variation,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

BF16_TIE = 0.25     # a bfloat16 logit's rounding after a few layers: top-2 margins below it may flip


def cuda_config(draft=TARGET, target=TARGET, dtype="float32", passes="auto", caches=4, **decoding):
    """A CUDA target of a few caches (max_running "auto" fits 64 of these tiny models' caches)."""
    config = random_engine_config(draft=draft, target=target, **decoding)
    config["target"].update(device="cuda", dtype=dtype, passes=passes)
    config["server"] = {"max_running": caches}
    return config


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (3, 1.0), (0, 0.8), (50, 0.9)])
def test_the_rows_sampling_reads_are_computed_on_the_gpu_as_on_the_host(top_k, top_p):
    """The worker's device path (scaled, cut to top-k and normalised on the GPU, the
    nucleus cut on the host) gives core.sampling's probabilities, ties at the k-th included."""
    from hetspec.core.sampling import Rule, Sampling, probabilities
    from hetspec.workers.target.worker import _probabilities

    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0))
    logits[:, 10:14] = 3.0                                     # a tie across the k-th place
    s = Sampling(Rule.KEYED, temperature=0.7, top_k=top_k, top_p=top_p, seed=1)
    got = _probabilities(logits.cuda(), s)
    want = probabilities(logits.numpy(), 0.7, top_k, top_p)
    assert np.array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("passes, draft", [("captured", WEAK_DRAFT), ("captured", TARGET), ("eager", WEAK_DRAFT)],
                         ids=["captured-weak-draft", "captured-same-draft", "eager-weak-draft"])
def test_float32_greedy_equals_the_targets_generate_on_the_gpu(draft, passes):
    """The captured engine with the weak draft fits its caches to the GPU (max_running "auto")."""
    model = load_reference(TARGET, device="cuda")
    fitted = passes == "captured" and draft == WEAK_DRAFT
    with hetspec.launch(cuda_config(draft=draft, passes=passes, caches="auto" if fitted else 4)) as engine:
        info = engine.get_info()
        assert info["target"]["device"] == "cuda" and info["keep_drafting"] is True
        assert ("recordings shared by every cache, as CUDA graphs" in info["target"]["kernels"]) == (passes == "captured")
        if fitted:
            assert 4 < info["config"]["server"]["max_running"] <= 64   # a tiny model's caches, what the GPU holds
        for prompt in PROMPTS:
            expected = reference_greedy(model, prompt, 40)
            for settings in SETTINGS:
                got = engine.generate(prompt, max_new_tokens=40, **settings).token_ids
                assert got == expected, (settings, explain_mismatch(model.cpu(), prompt, got, expected))


@torch.inference_mode()
def _off_its_batched_argmax(model, prompt, new):
    """Positions where `new` is not the argmax of one batched pass over prompt + new, with
    the top-2 margin there."""
    logits = model(torch.tensor([prompt + new], device="cuda")).logits[0, len(prompt) - 1:-1].float()
    top = torch.topk(logits, 2)
    return [(i, float(top.values[i, 0] - top.values[i, 1])) for i, t in enumerate(new) if int(top.indices[i, 0]) != t]


def test_bfloat16_follows_the_targets_batched_pass():
    model = load_reference(TARGET, "bfloat16", "cuda")
    with hetspec.launch(cuda_config(dtype="bfloat16")) as engine:
        for prompt in PROMPTS:
            # even the target alone (one token a pass, as generate) may flip a near-tie: its
            # captured pass reads a masked static cache, generate a dynamic one
            for settings in SETTINGS:
                got = engine.generate(prompt, max_new_tokens=40, **settings).token_ids
                off = _off_its_batched_argmax(model, prompt, got)
                assert all(margin < BF16_TIE for _, margin in off), (settings, off)
                assert len(off) <= len(got) // 4, (settings, off)


@pytest.mark.parametrize("passes", ["captured", "eager"])
def test_concurrent_requests_step_together_on_the_gpu_each_with_its_output_alone(passes):
    """A batch in one pass on the GPU: packed (eager), or the recorded pass over the caches' rows
    (captured, a grouped-query target: its attention over shared KV heads, unrepeated)."""
    grouped = "random:kv_heads=2,seed=0"
    config = cuda_config(draft=grouped, target=grouped, passes=passes, lookup=4) if passes == "captured" \
        else cuda_config(passes=passes, lookup=4)
    with hetspec.launch(config) as engine:
        assert ("grouped-query attention" in engine.info["target"]["kernels"]) == (passes == "captured")
        alone = [engine.generate(prompt, **params) for prompt, params in REQUESTS]
        together = run_all(engine, REQUESTS)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert sum(r.stats["batched_rounds"] for r in together) > 0


def test_sampling_keeps_the_targets_law_on_the_gpu():
    """The first three tokens' marginals over a vocabulary of 8, speculation and rejections
    in play, under both rules (test_engine_sampling does the same with a CPU target)."""
    target, draft, prompt, n = "random:vocab=8,seed=0", "random:vocab=8,seed=2", [1, 2, 3], 1000
    exact = exact_joint(load_reference(target), prompt, 8, 1.0)
    with hetspec.launch(cuda_config(draft=draft, target=target, keep_drafting=True)) as engine:
        for seeded in (True, False):
            counts, drafted = np.zeros_like(exact), 0
            for seed in range(n):
                result = engine.generate(prompt, max_new_tokens=6, temperature=1.0, seed=seed if seeded else None,
                                         mode="duodec", gamma=2)
                counts[tuple(result.token_ids[:3])] += 1
                drafted += result.stats["drafted"]
            for axes in [(1, 2), (0, 2), (0, 1)]:
                got, want = counts.sum(axis=axes) / n, exact.sum(axis=axes)
                assert total_variation(got, want) < 0.08, (seeded, axes, np.round(got, 3), np.round(want, 3))
            assert drafted > 0
