"""A draft with another tokenizer than the target's (scheduler/decoding/bridge.py): output
stays exactly the target's, greedy and sampled, in every mode; bad pairs are
refused by name."""
import tomllib
from importlib import resources

import numpy as np
import pytest
import torch

import hetspec
from hetspec.core.errors import EngineStartError
from hetspec.models import resolve_model
from hetspec.scheduler.decoding.bridge import Anchor
from hetspec.scheduler.tokenizer import Tokenizer

from helpers import FULL, draws, exact_joint, load_reference, noise_scale, reference_greedy, total_variation

SMOL = "random:vocab=49152,tokenizer=smollm2,seed=0"
GEMMA = "random:vocab=262144,tokenizer=gemma3-270m,seed=3"
TEXT = "def add(a, b):\n    return a + b\n\nThe sea was calm, and the ship sailed on. Café, naïve, 東京 😀 — done.\n"


def _config(draft, target, **decoding):
    return {"draft": {"backend": "torch", "model": draft}, "target": {"model": target},
            "decoding": {"gamma": 4, **decoding}}


@pytest.fixture(scope="module", params=[(GEMMA, SMOL), (SMOL, GEMMA)], ids=["smollm2-target", "gemma-target"])
def pair(request):
    draft, target = request.param
    with hetspec.launch(_config(draft, target)) as engine:
        yield engine, target, load_reference(target)


@pytest.mark.parametrize("mode,sequences", [("duodec", "dynamic"), ("duodec", 2), pytest.param("sequential", None, marks=FULL),
                                            pytest.param("target", None, marks=FULL)])
def test_greedy_across_vocabularies_equals_target_generate(pair, mode, sequences):
    engine, target, model = pair
    tokenizer = Tokenizer(resolve_model(target))
    for prompt in ["def fibonacci(n):\n    ", "Once upon a time"]:
        ids = tokenizer.encode_prompt(prompt)
        result = engine.generate(prompt, max_new_tokens=24, mode=mode, sequences=sequences, speculation="always")
        expected = reference_greedy(model, ids, 24)
        assert result.token_ids == expected[:len(result.token_ids)]
        assert len(result.token_ids) == 24 or result.finish_reason == "stop"   # a random model may say EOS
        if mode != "target":
            assert result.stats["spec_rounds"] > 0 and result.stats["drafted"] > 0


def test_a_draft_prefill_that_cannot_pay_is_skipped():
    """A long prompt for three new tokens: the draft's prefill would outlast the whole
    request (CostModel.prefill_pays, gamma "auto"), so the target decodes alone and
    says why; forced, the draft prefills."""
    prompt = TEXT * 8
    with hetspec.launch(_config(GEMMA, SMOL, gamma="auto")) as engine:
        result = engine.generate(prompt, max_new_tokens=3)
        forced = engine.generate(prompt, max_new_tokens=3, speculation="always")
    assert "prefill" in (result.stats["fallback"] or "") and result.stats["spec_rounds"] == 0
    ids = Tokenizer(resolve_model(SMOL)).encode_prompt(prompt)
    assert result.token_ids == reference_greedy(load_reference(SMOL), ids, 3)[:len(result.token_ids)]
    assert forced.stats["fallback"] is None and forced.token_ids == result.token_ids


def test_engine_info_says_how_vocabularies_are_bridged(pair):
    engine, _, _ = pair
    vocabulary = engine.get_info()["vocabulary"]
    assert vocabulary["shared"] is False and vocabulary["target"] != vocabulary["draft"]
    assert vocabulary["bridge"].startswith("text:")


def test_anchor_matches_encoding_the_whole_text():
    """Re-encoding only the tail after the anchor gives the draft the same tokens as
    encoding the whole context, at every length, through characters of several bytes."""
    smol, gemma = (Tokenizer(resolve_model(f"builtin:{n}")) for n in ("smollm2", "gemma3-270m"))
    for target, draft in [(gemma, smol), (smol, gemma)]:
        ids = np.asarray(target.encode_prompt(TEXT * 6), np.int32)
        anchor = Anchor(target, draft, lag=12)
        for n in range(1, len(ids) + 1):
            whole = draft.encode_start() + draft.encode_text(target.decode(ids[:n]))
            assert anchor(ids[:n]).tolist() == whole, n
        assert len(anchor.target_ids) > len(ids) // 2   # it did move forward
        anchor = Anchor(target, draft, lag=12)
        for n in range(1, len(ids) - 8, 3):              # rounds: a check (committed text), again, a window's
            for m, settled in ((n, True), (n, False), (n + 8, False), (n + 1, True)):   # context, a rejection
                expected = draft.encode_start() + draft.encode_text(target.decode(ids[:m]))
                assert anchor(ids[:m], settled).tolist() == expected, m
        assert len(anchor.target_ids) > len(ids) - 24    # committed text: it kept up


# ---- sampling: a target and a draft of different byte vocabularies (ids 0..7 and 0..8) ----

BYTE_TARGET = "random:vocab=8,seed=0"
BYTE_DRAFT = "random:vocab=9,seed=2"
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def byte_pair():
    with hetspec.launch(_config(BYTE_DRAFT, BYTE_TARGET)) as engine:
        yield engine


@pytest.mark.parametrize("mode,sequences", [("duodec", "dynamic")])   # sequential: the same rule, no branches
def test_sampling_across_vocabularies_follows_target_distribution(byte_pair, mode, sequences):
    assert byte_pair.get_info()["vocabulary"]["shared"] is False
    exact = exact_joint(load_reference(BYTE_TARGET), PROMPT, 8, 1.0)
    n, counts, accepted, drafted = draws(1200), np.zeros_like(exact), 0, 0
    for seed in range(n):
        result = byte_pair.generate(PROMPT, max_new_tokens=6, temperature=1.0, seed=seed, mode=mode, gamma=2,
                                    sequences=sequences, speculation="always")
        counts[tuple(result.token_ids[:3])] += 1
        accepted += result.stats["accepted"]
        drafted += result.stats["drafted"]
    empirical = counts / n
    for axes, bound in [((1, 2), 0.06), ((0, 2), 0.06), ((0, 1), 0.06), (2, 0.15)]:   # set for 1200 draws
        assert total_variation(empirical.sum(axis=axes), exact.sum(axis=axes)) < bound * noise_scale(n, 1200), axes
    assert 0 < accepted < drafted      # proposals were taken, and refused


@pytest.mark.parametrize("mode,speculation", [("duodec", "always"), ("sequential", "always"), ("duodec", "auto")])
def test_seeded_sampling_across_vocabularies_gives_the_target_alone_tokens(byte_pair, mode, speculation):
    """Each token is the target's keyed draw (core/sampling.draw_keyed), so a seed
    gives the tokens the target alone gives, however the rounds fell and whether or
    not the engine rested from speculating."""
    accepted = 0
    for seed in range(25):
        sampling = {"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": seed}
        alone = byte_pair.generate(PROMPT, mode="target", **sampling)
        result = byte_pair.generate(PROMPT, mode=mode, speculation=speculation, **sampling)
        assert result.token_ids == alone.token_ids, seed
        accepted += result.stats["accepted"]
    if speculation == "always":    # "auto" may rest throughout: on a slow or busy machine it did
        assert accepted > 0


# ---- bad pairs ----

def _checkpoint(folder, vocab):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def test_a_draft_whose_tokenizer_cannot_be_loaded_is_refused(tmp_path):
    draft = _checkpoint(tmp_path / "no-tokenizer", 320)
    with pytest.raises(EngineStartError, match="the draft's tokenizer: could not load"):
        hetspec.launch(_config(draft, "random:seed=0"))


def test_a_draft_vocabulary_that_cannot_express_the_text_is_refused(tmp_path):
    from tokenizers import Tokenizer as Raw
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "the", "quick", "brown", "fox"]
    raw = Raw(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = Whitespace()
    folder = _checkpoint(tmp_path / "few-words", 320)
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(folder)
    with pytest.raises(EngineStartError, match="cannot express the target's text"):
        hetspec.launch(_config(folder, "random:seed=0"))


# ---- the real heterogeneous pair: Gemma 3 270M target, SmolLM2-135M draft ----

@pytest.mark.integration
@FULL
def test_gemma_target_with_smollm2_draft_equals_gemma_generate():
    from hetspec.workers.common.hf_loading import load_causal_lm

    spec = resolve_model("builtin:gemma3-270m")
    model, tokenizer = load_causal_lm(spec, "float32", "cpu"), Tokenizer(spec)
    config = tomllib.loads(resources.files("hetspec.configs").joinpath("gemma3-smollm2.toml").read_text())
    config["target"]["backend"] = "transformers"    # float32, as generate (tests/test_llama_target.py: llama.cpp)
    with hetspec.launch(config) as engine:
        assert engine.get_info()["vocabulary"]["shared"] is False
        accepted = 0
        for prompt in ["def fibonacci(n):\n    ", "The three primary colours are"]:
            ids = tokenizer.encode_prompt(prompt)
            out = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, num_beams=1)
            expected = out[0, len(ids):].tolist()
            for mode in ("duodec", "sequential"):
                result = engine.generate(prompt, max_new_tokens=32, mode=mode, speculation="always")
                assert result.token_ids == expected, (mode, prompt)
                accepted += result.stats["accepted"]
        assert accepted > 0                 # the draft's proposals, translated, were taken
