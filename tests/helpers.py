"""Helpers for the tests: tiny random models (no files) and references to compare with."""
import os

import numpy as np
import pytest
import torch

from hetspec.core.sampling import probabilities
from hetspec.models import resolve_model
from hetspec.workers.common.hf_loading import load_causal_lm

TARGET = "random:seed=0"
WEAK_DRAFT = "random:seed=1"          # a different random model: disagrees often
# The short form CI runs: the tests of a sampled law draw a third of their samples (their
# bounds widen by sqrt(3), as the noise does), and tests marked FULL are skipped (each a
# slower twin of one CI keeps: another weight type, the other shipped file, a longer soak).
# HETSPEC_FULL_TESTS=1 (scripts/full_tests.sh) runs them all, with every sample.
FULL_TESTS = os.environ.get("HETSPEC_FULL_TESTS") == "1"
FULL = pytest.mark.full


def full_only(*values, keep=()):
    """Parameters for parametrize: those in `keep` run in CI too, the others in the full form only."""
    return [v if v in keep else pytest.param(v, marks=FULL) for v in values]


def draws(full: int) -> int:
    """How many samples a test of a sampled law takes: `full` in the full form, a third in CI's."""
    return full if FULL_TESTS else full // 3


def noise_scale(n: int, full: int) -> float:
    """How much wider a bound set for `full` draws is at n: sampling noise goes as 1 / sqrt(n)."""
    return (full / n) ** 0.5


def random_engine_config(draft=TARGET, target=TARGET, **decoding):
    """speculation "always": tests of the speculative paths must not see them rested
    (a weak draft would be), except tests of that rest (test_gate.py)."""
    return {"draft": {"backend": "torch", "model": draft}, "target": {"model": target},
            "decoding": {"gamma": 4, "speculation": "always", **decoding}}


def load_reference(spec: str, dtype: str = "float32", device: str = "cpu"):
    return load_causal_lm(resolve_model(spec), dtype, device)


def reference_greedy(model, prompt_ids, max_new_tokens):
    """The target's own greedy decoding (transformers generate, on the model's device), new tokens only."""
    ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt_ids):].tolist()




def explain_mismatch(model, prompt_ids, got, expected) -> str:
    """Where outputs differ, show the target's top-2 margin there: a float tie flips an
    argmax legitimately only when that margin is tiny."""
    i = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    ids = torch.tensor([prompt_ids + expected[:i]])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    top = torch.topk(logits, 2)
    return (f"first difference at new token {i}: got {got[i:i + 3]}, expected {expected[i:i + 3]}; "
            f"target top-2 {top.indices.tolist()} with logit margin {float(top.values[0] - top.values[1]):.3g}")


def conditional(model, ids, temperature, top_k, top_p):
    """The target's own sampling distribution after ids."""
    with torch.no_grad():
        logits = model(torch.tensor([list(ids)])).logits[0, -1:].numpy()
    return probabilities(logits, temperature, top_k, top_p)[0].astype(np.float64)


def exact_joint(model, prompt, vocab, temperature, top_k=0, top_p=1.0):
    """P(x1, x2, x3 | prompt) under the target's own sampling, by enumeration."""
    p1 = conditional(model, prompt, temperature, top_k, top_p)
    joint = np.zeros((vocab, vocab, vocab))
    for a in range(vocab):
        p2 = conditional(model, [*prompt, a], temperature, top_k, top_p)
        for b in range(vocab):
            joint[a, b] = p1[a] * p2[b] * conditional(model, [*prompt, a, b], temperature, top_k, top_p)
    return joint


def total_variation(a, b):
    return 0.5 * np.abs(a - b).sum()
