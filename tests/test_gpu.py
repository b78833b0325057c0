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


def cuda_config(draft=TARGET, target=TARGET, dtype="float32", passes="auto", **decoding):
    config = random_engine_config(draft=draft, target=target, **decoding)
    config["target"].update(device="cuda", dtype=dtype, passes=passes)
    return config


@pytest.mark.parametrize("passes", ["eager", "static", "captured"])
@pytest.mark.parametrize("draft", [TARGET, WEAK_DRAFT], ids=["same-draft", "weak-draft"])
def test_float32_greedy_equals_the_targets_generate_on_the_gpu(draft, passes):
    model = load_reference(TARGET, device="cuda")
    with hetspec.launch(cuda_config(draft=draft, passes=passes)) as engine:
        info = engine.get_info()
        assert info["target"]["device"] == "cuda" and info["keep_drafting"] is True
        assert ("each recorded as a CUDA graph" in info["target"]["kernels"]) == (passes == "captured")
        assert 4 < info["config"]["server"]["max_running"] <= 64   # "auto": a tiny model's caches, what the GPU holds
        for prompt in PROMPTS:
            expected = reference_greedy(model, prompt, 40)
            for settings in SETTINGS:
                got = engine.generate(prompt, max_new_tokens=40, **settings).token_ids
                assert got == expected, (settings, explain_mismatch(model.cpu(), prompt, got, expected))


@pytest.mark.parametrize("passes", ["eager", "captured"])
def test_concurrent_requests_step_together_on_the_gpu_each_with_its_output_alone(passes):
    """A batch in one pass on the GPU: packed (eager), or the recorded batch pass (captured)."""
    with hetspec.launch(cuda_config(passes=passes, lookup=4)) as engine:
        alone = [engine.generate(prompt, **params) for prompt, params in REQUESTS]
        together = run_all(engine, REQUESTS)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert sum(r.stats["batched_rounds"] for r in together) > 0


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
            # the target alone decodes one token a pass, as generate does
            assert engine.generate(prompt, max_new_tokens=40, mode="target").token_ids == reference_greedy(model, prompt, 40)
            for settings in SETTINGS[1:]:
                got = engine.generate(prompt, max_new_tokens=40, **settings).token_ids
                off = _off_its_batched_argmax(model, prompt, got)
                assert all(margin < BF16_TIE for _, margin in off), (settings, off)
                assert len(off) <= len(got) // 4, (settings, off)


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
