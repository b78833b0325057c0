"""The transformers form of a GGUF file, kept after the first load (hetspec/models.py,
workers/common/hf_loading.py, hetspec/scheduler/tokenizer.py): the kept copy is the same model and
tokenizer, a damaged one is rebuilt, and HETSPEC_CACHE=off keeps nothing."""
import os
import shutil

import pytest
import torch

from hetspec.models import resolve_model
from hetspec.scheduler import startup
from hetspec.scheduler.tokenizer import Tokenizer
from hetspec.workers.common.hf_loading import eos_token_ids, load_causal_lm

from helpers import FULL

pytestmark = pytest.mark.integration

TEXT = "The three primary colours are"


def _run(model):
    lm = load_causal_lm(model, "float32")
    tokenizer = Tokenizer(model)
    ids = tokenizer.encode_chat([{"role": "user", "content": TEXT}])
    with torch.inference_mode():
        logits = lm(torch.tensor([ids])).logits
    return ids, logits, eos_token_ids(lm), tokenizer.eos_token_ids


@FULL
def test_kept_copy_is_the_same_model_and_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("HETSPEC_CACHE", str(tmp_path))
    model = resolve_model("builtin:smollm2")
    assert model.cache_dir.startswith(str(tmp_path))
    converted = _run(model)
    assert sorted(os.listdir(model.cache_dir)) == ["model-float32", "tokenizer"]
    assert not [name for name in os.listdir(tmp_path) if ".partial-" in name]
    markers = [os.path.join(model.cache_dir, name, "marker") for name in ("model-float32", "tokenizer")]
    for marker in markers:
        open(marker, "w").close()
    kept = _run(model)
    assert all(os.path.exists(marker) for marker in markers)         # read, not converted and replaced again
    assert converted[0] == kept[0] and converted[2:] == kept[2:]
    assert torch.equal(converted[1], kept[1])                       # bit for bit

    weights = os.path.join(model.cache_dir, "model-float32", "model.safetensors")
    with open(weights, "r+b") as f:                                  # a damaged copy is converted again
        f.truncate(100)
    assert torch.equal(_run(model)[1], converted[1])
    assert os.path.getsize(weights) > 100


def test_cache_off_keeps_nothing(monkeypatch):
    monkeypatch.setenv("HETSPEC_CACHE", "off")
    assert resolve_model("builtin:smollm2").cache_dir == ""


def test_a_draft_with_the_targets_kept_tokenizer_shares_it(tmp_path, monkeypatch):
    """Two files of one vocabulary (as Qwen2.5-Coder's 0.5B and 1.5B are): once both kept
    tokenizers are written and equal, the scheduler holds one (startup.draft_tokenizer)."""
    monkeypatch.setenv("HETSPEC_CACHE", str(tmp_path / "cache"))
    source = resolve_model("builtin:smollm2").file
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(source, copy)
    target, draft = resolve_model(source), resolve_model(str(copy))
    target_tokenizer = Tokenizer(target)
    first = startup.draft_tokenizer(draft, target, target_tokenizer)     # its kept copy is written now
    assert first is not target_tokenizer and first.vocabulary() == target_tokenizer.vocabulary()
    assert startup.draft_tokenizer(draft, target, target_tokenizer) is target_tokenizer
    assert startup.draft_tokenizer(target, target, target_tokenizer) is None              # the target's own file
    with open(os.path.join(draft.cache_dir, "tokenizer", "tokenizer.json"), "a") as f:    # another rule: its own
        f.write(" ")
    assert startup.draft_tokenizer(draft, target, target_tokenizer) is not target_tokenizer
