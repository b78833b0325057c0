"""Prompt lookup (scheduler/decoding/lookup.py): its index finds what a plain
search of the context finds, however the context grows; the likeliest follower
is guessed; each match length keeps its own hit rate."""
import numpy as np

from hetspec.scheduler.decoding.lookup import NGRAM, PromptLookup


def plain_search(context: list[int]) -> tuple[int, int]:
    """(n, start) for the longest suffix (n = NGRAM..1) seen earlier: of the tokens that
    followed it, the most frequent (the latest on a tie), at its latest occurrence."""
    for n in range(NGRAM, 0, -1):
        if len(context) <= n:
            continue
        after = [start + n for start in range(len(context) - n) if context[start:start + n] == context[-n:]]
        if after:
            return n, max(after, key=lambda i: (sum(context[j] == context[i] for j in after), i))
    return 0, 0


def test_the_index_finds_what_a_plain_search_finds():
    rng = np.random.default_rng(0)
    for _ in range(300):
        context = rng.integers(0, rng.integers(2, 8), rng.integers(1, 60)).astype(np.int32)
        lookup = PromptLookup()
        for cut in sorted({*rng.integers(1, len(context) + 1, 4).tolist(), len(context)}):   # grown in steps
            assert lookup.match(context[:cut]) == plain_search(context[:cut].tolist())


def test_a_repeated_phrase_is_guessed_and_a_fresh_one_is_not():
    lookup = PromptLookup()
    context = np.array([7, 1, 2, 3, 4, 5, 9, 1, 2, 3], np.int32)
    assert lookup.match(context) == (3, 4)                    # [1, 2, 3] was followed by 4, 5, 9, 1
    assert lookup.match(np.append(context, 42).astype(np.int32)) == (0, 0)


def test_a_guess_continues_drafted_tokens_without_indexing_them():
    """After a pending window (ahead), the guess follows it; its tokens are not recorded, so
    a window the target rejects leaves the index as the committed text alone makes it."""
    lookup = PromptLookup()
    context = np.array([7, 1, 2, 3, 4, 5, 9], np.int32)
    assert lookup.guess(context, lambda rate: 3, ahead=np.array([1, 2], np.int32)).tolist() == [3, 4, 5]
    assert lookup.indexed == len(context) and lookup.match(context) == plain_search(context.tolist())
    assert lookup.guess(context, lambda rate: 3, ahead=np.array([42], np.int32)).tolist() == []


def test_the_likeliest_follower_beats_the_latest():
    """`x = a` twice, then `x = b`: after `x =` the guess is `a`, from its latest occurrence."""
    x, eq, a, b, nl = 1, 2, 3, 4, 5
    context = np.array([nl, x, eq, a, nl, x, eq, a, nl, x, eq, b, nl, x, eq], np.int32)
    n, start = PromptLookup().match(context)
    assert (n, context[start], start) == (3, a, 7)


def test_each_match_length_keeps_its_own_hit_rate():
    """A guess's length comes from the hit rate of guesses that matched as many tokens."""
    lookup, asked = PromptLookup(), []
    context = np.array([7, 1, 2, 3, 4, 5, 9, 1, 2, 3], np.int32)
    assert lookup.guess(context, lambda rate: asked.append(rate) or 2).tolist() == [4, 5]
    lookup.verified(2, 2)                                    # a three-token match held
    lookup.guess(np.append(context, [8, 9]).astype(np.int32), lambda rate: asked.append(rate) or 1)
    lookup.verified(1, 0)                                    # a one-token match ([9]) did not
    assert asked == [0.5, 0.5] and lookup.hit_rate(3) > 0.5 > lookup.hit_rate(1)
    assert lookup.hit_rate(2) == 0.5
    lookup.guess(context, lambda rate: asked.append(rate) or 0)
    assert asked[-1] == lookup.hit_rate(3)


# ---- in the engine: a target-only round of a speculative mode verifies a guess ----

import hetspec

from helpers import load_reference, random_engine_config, reference_greedy

LOOPING = "random:vocab=12,seed=0"         # a small vocabulary: greedy text soon repeats itself
PROMPT = [1, 2, 3, 4, 5]


def test_guesses_keep_every_mode_exact_and_mode_target_plain():
    """duodec and sequential guess in their target-only rounds, lookup in every step, target never."""
    config = random_engine_config(draft="random:vocab=12,seed=1", target=LOOPING, speculation="auto")
    expected = reference_greedy(load_reference(LOOPING), PROMPT, 80)
    with hetspec.launch(config) as engine:
        for mode in ("duodec", "sequential"):
            result = engine.generate(PROMPT, max_new_tokens=80, mode=mode)
            assert result.token_ids == expected
            assert result.stats["lookup_accepted"] > 0 and result.stats["rounds"] < 80
        alone = engine.generate(PROMPT, max_new_tokens=80, mode="target")
        assert alone.token_ids == expected and alone.stats["lookup_guessed"] == 0
        lookup = engine.generate(PROMPT, max_new_tokens=80, mode="lookup")   # the target, with guesses alone
        assert lookup.token_ids == expected and lookup.stats["lookup_accepted"] > 0
        assert lookup.stats["drafted"] == 0 and lookup.stats["fallback"] is None and lookup.stats["gamma"] == 0
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
