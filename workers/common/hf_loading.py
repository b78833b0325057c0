"""Load a transformers causal LM from a resolved model spec (a hetspec.ipc.specs.ModelSpec).

A GGUF file is dequantized by transformers' GGUF loader (needs gguf and
accelerate), once: the result is kept in the spec's cache_dir (chosen by the
engine when it resolves the model) and read from there next time. A "random"
spec builds a tiny model from a config, for tests.
"""
from __future__ import annotations

import copy
import os

import torch

from hetspec.core.kept import load_or_convert
from hetspec.ipc.specs import ModelSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, model: ModelSpec, device: str) -> str:
    """[target] dtype "auto": float32 on a CPU; on CUDA a checkpoint's own ("checkpoint"),
    bfloat16 for a GGUF file (dequantized straight into it) or a random model."""
    if dtype != "auto":
        return dtype
    if not device.startswith("cuda"):
        return "float32"
    return "checkpoint" if model.kind in ("dir", "hub") else "bfloat16"


def load_causal_lm(model: ModelSpec, dtype: str = "float32", device: str = "cpu"):
    """The model in `dtype` (a name of DTYPES, "auto" or "checkpoint": its own) on `device`."""
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(dtype, model, device)
    kind = model.kind
    if kind == "random":
        lm = _random_model(model.random, DTYPES[dtype], device if model.random.get("init") == "device" else "cpu")
    elif kind == "gguf":
        lm = _from_gguf(model, dtype)
    else:
        lm = AutoModelForCausalLM.from_pretrained(model.path, dtype="auto" if dtype == "checkpoint" else DTYPES[dtype])
    return lm.to(device).eval()


def _from_gguf(model: ModelSpec, dtype: str):
    from transformers import AutoModelForCausalLM

    torch_dtype = DTYPES[dtype]
    kept = os.path.join(model.cache_dir, f"model-{dtype}") if model.cache_dir else ""
    return load_or_convert(
        kept, lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype),
        lambda: AutoModelForCausalLM.from_pretrained(model.path, gguf_file=model.gguf_file, dtype=torch_dtype), _save)


def _save(lm, folder: str) -> None:
    """A plain checkpoint: the weights are saved dequantized, tied ones once."""
    from safetensors.torch import save_model

    config = copy.deepcopy(lm.config)
    if "quantization_config" in vars(config):
        del config.quantization_config
    os.makedirs(folder)
    config.save_pretrained(folder)
    lm.generation_config.save_pretrained(folder)
    save_model(lm, os.path.join(folder, "model.safetensors"))


def _random_model(spec: dict, torch_dtype, device: str = "cpu"):
    """Weights drawn with a wide init so that logits are peaked: near-uniform
    logits would make argmax ties, and so exactness tests, meaningless. Drawn on
    `device` (each device's generator draws other numbers)."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    common = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["intermediate"],
                  num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                  num_key_value_heads=spec.get("kv_heads") or spec["heads"], max_position_embeddings=8192,
                  initializer_range=0.25,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    if spec["arch"] == "gemma3":
        config = Gemma3TextConfig(**common, head_dim=spec["hidden"] // spec["heads"], sliding_window=spec["window"],
                                  layer_types=["sliding_attention", "full_attention"] * (spec["layers"] // 2)
                                  + ["sliding_attention"] * (spec["layers"] % 2))
    else:
        config = LlamaConfig(**common)
    torch.manual_seed(spec["seed"])
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch_dtype)


def eos_token_ids(lm) -> list[int]:
    eos = getattr(lm.generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
