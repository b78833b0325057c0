"""Prompt lookup (scheduler/decoding/lookup.py): its index finds what a plain
search of the context finds, however the context grows."""
import numpy as np

from hetspec.scheduler.decoding.lookup import NGRAM, PromptLookup


def plain_search(context: list[int], limit: int) -> list[int]:
    """The tokens after the latest earlier occurrence of the longest suffix (n = NGRAM..1)."""
    for n in range(NGRAM, 0, -1):
        if len(context) <= n:
            continue
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == context[-n:]:
                return context[start + n:start + n + limit]
    return []


def test_the_index_finds_what_a_plain_search_finds():
    rng = np.random.default_rng(0)
    for _ in range(300):
        context = rng.integers(0, rng.integers(2, 8), rng.integers(1, 60)).astype(np.int32)
        lookup = PromptLookup()
        for cut in sorted({*rng.integers(1, len(context) + 1, 4).tolist(), len(context)}):   # grown in steps
            limit = int(rng.integers(0, 6))
            assert lookup.guess(context[:cut], limit).tolist() == plain_search(context[:cut].tolist(), limit)


def test_a_repeated_phrase_is_guessed_and_a_fresh_one_is_not():
    lookup = PromptLookup()
    context = np.array([7, 1, 2, 3, 4, 5, 9, 1, 2, 3], np.int32)
    assert lookup.guess(context, 4).tolist() == [4, 5, 9, 1]
    assert lookup.guess(np.append(context, 42).astype(np.int32), 4).tolist() == []


# ---- in the engine: a target-only round of a speculative mode verifies a guess ----

import hetspec  # noqa: E402

from helpers import load_reference, random_engine_config, reference_greedy  # noqa: E402

LOOPING = "random:vocab=12,seed=0"         # a small vocabulary: greedy text soon repeats itself
PROMPT = [1, 2, 3, 4, 5]


def test_guesses_keep_every_mode_exact_and_mode_target_plain():
    config = random_engine_config(draft="random:vocab=12,seed=1", target=LOOPING, speculation="auto")
    expected = reference_greedy(load_reference(LOOPING), PROMPT, 80)
    with hetspec.launch(config) as engine:
        for mode in ("duodec", "sequential"):
            result = engine.generate(PROMPT, max_new_tokens=80, mode=mode)
            assert result.token_ids == expected
            assert result.stats["lookup_accepted"] > 0 and result.stats["rounds"] < 80
        alone = engine.generate(PROMPT, max_new_tokens=80, mode="target")
        assert alone.token_ids == expected and alone.stats["lookup_guessed"] == 0
        # a seed's tokens are the target alone's; unseeded sampling weighs each guess by p
        seeded = [engine.generate(PROMPT, max_new_tokens=60, temperature=0.8, seed=7, mode=mode)
                  for mode in ("duodec", "target")]
        assert seeded[0].token_ids == seeded[1].token_ids and seeded[0].stats["lookup_guessed"] > 0
        unkeyed = engine.generate(PROMPT, max_new_tokens=60, temperature=0.3)
        assert unkeyed.stats["rule"] == "unkeyed" and unkeyed.stats["lookup_accepted"] > 0
        assert len(unkeyed.token_ids) == 60


def test_lookup_zero_guesses_nothing():
    config = random_engine_config(target=LOOPING, draft="random:vocab=12,seed=1", speculation="auto", lookup=0)
    with hetspec.launch(config) as engine:
        result = engine.generate(PROMPT, max_new_tokens=40)
        assert result.stats["lookup_guessed"] == 0 and result.stats["rested"] > 0
        assert engine.get_info()["lookup"] == 0
