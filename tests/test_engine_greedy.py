"""Greedy output through the engine equals the target's own greedy decoding
(transformers generate), token for token, in every mode and for every draft
budget and branch count, with a draft that always agrees and one that rarely does
(and keeps drafting while the target verifies)."""
import pytest

import hetspec

from helpers import FULL, TARGET, WEAK_DRAFT, explain_mismatch, load_reference, random_engine_config, reference_greedy

PROMPTS = [[1, 2, 3, 4, 5], list(range(100, 140)), [7]]
SETTINGS = [dict(mode="target"), dict(mode="sequential", gamma=3), dict(mode="duodec", gamma=1),
            dict(mode="duodec", gamma=5), dict(mode="duodec", gamma=8, sequences=3),
            dict(mode="duodec", gamma=6, sequences="dynamic"), dict(mode="duodec", gamma=4, cache_prompt=False)]


@pytest.fixture(scope="module", params=["same-draft", "weak-draft"])
def engine(request):
    draft = TARGET if request.param == "same-draft" else WEAK_DRAFT
    # The weak draft's engine also keeps drafting while the target verifies (off by
    # default on a CPU target): extended windows, and late extensions, among rejections.
    keep = request.param == "weak-draft"
    with hetspec.launch(random_engine_config(draft=draft, keep_drafting=keep)) as engine:
        assert engine.get_info()["keep_drafting"] is keep
        engine.draft_kind = request.param
        yield engine


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_greedy_equals_target_generate(engine, target_model, settings):
    for prompt in PROMPTS:
        expected = reference_greedy(target_model, prompt, 40)
        result = engine.generate(prompt, max_new_tokens=40, **settings)
        assert result.token_ids == expected, explain_mismatch(target_model, prompt, result.token_ids, expected)
        assert result.finish_reason == "length"
        assert result.stats["new_tokens"] == 40


def test_acceptance_reflects_the_draft(engine):
    stats = engine.generate(PROMPTS[1], max_new_tokens=60, gamma=4, sequences=1).stats
    if engine.draft_kind == "same-draft":
        assert stats["acceptance_rate"] > 0.9 and stats["mean_accepted_per_round"] > 3
    else:                                       # rejections happen and are recovered from
        assert stats["acceptance_rate"] < 0.5 and stats["spec_rounds"] > 10


@pytest.mark.parametrize("draft", [pytest.param(TARGET, marks=FULL), WEAK_DRAFT], ids=["same-draft", "weak-draft"])
def test_an_automatic_budget_rebalanced_every_round_stays_exact(target_model, draft):
    """gamma = "auto": each round's draft follows the measured costs, past the start-up gamma."""
    config = random_engine_config(draft=draft)
    config["decoding"]["gamma"] = "auto"
    with hetspec.launch(config) as engine:
        assert engine.get_info()["budget"]["source"] == "measured"
        for prompt in PROMPTS:
            expected = reference_greedy(target_model, prompt, 40)
            for sequences in (1, "dynamic"):
                result = engine.generate(prompt, max_new_tokens=40, sequences=sequences)
                assert result.token_ids == expected, explain_mismatch(target_model, prompt, result.token_ids, expected)


def test_sliding_window_target_with_rollbacks():
    """Gemma 3 style sliding-window attention: rollbacks far past the window stay exact."""
    target = "random:arch=gemma3,window=8,layers=4,seed=0"
    config = random_engine_config(draft="random:arch=gemma3,window=8,layers=4,seed=9", target=target)
    model = load_reference(target)
    with hetspec.launch(config) as engine:
        for prompt in PROMPTS[:2]:
            expected = reference_greedy(model, prompt, 48)
            for settings in SETTINGS[2:]:
                result = engine.generate(prompt, max_new_tokens=48, **settings)
                assert result.token_ids == expected, explain_mismatch(model, prompt, result.token_ids, expected)


def test_stop_at_eos_and_stop_string(engine, target_model):
    expected = reference_greedy(target_model, PROMPTS[0], 30)
    # a stop string made of the bytes of some generated tokens (byte tokenizer: ids < 256 are bytes)
    result = engine.generate(PROMPTS[0], max_new_tokens=30)
    text_ids = [t for t in expected if 32 <= t < 127]
    if len(text_ids) >= 2:
        stop = bytes(text_ids[:2]).decode()
        stopped = engine.generate(PROMPTS[0], max_new_tokens=30, stop=[stop])
        assert stopped.finish_reason == "stop"
        assert stop not in stopped.text and result.text.startswith(stopped.text)
