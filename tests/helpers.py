"""Helpers for the tests: tiny random models (no files) and references to compare with."""
import torch

from hetspec.models import resolve_model
from hetspec.workers.target.hf_loading import load_causal_lm

TARGET = "random:seed=0"
WEAK_DRAFT = "random:seed=1"          # a different random model: disagrees often


def random_engine_config(draft=TARGET, target=TARGET, **decoding):
    return {"draft": {"backend": "torch", "model": draft}, "target": {"model": target},
            "decoding": {"gamma": 4, **decoding}}


def load_reference(spec: str):
    return load_causal_lm(resolve_model(spec), "float32", "cpu")


def reference_greedy(model, prompt_ids, max_new_tokens):
    """The target's own greedy decoding (transformers generate), new tokens only."""
    ids = torch.tensor([prompt_ids])
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
