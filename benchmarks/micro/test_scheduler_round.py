"""The scheduler's own time per round: the real scheduler and Decoder over workers that compute
nothing (echo_engine.py), a 256-token request a call. extra_info keeps round_ms (the call's wall
over its rounds) and overhead_ms (Stats' overhead_s per speculative round), best and median. One
engine drafts gamma GAMMA, its workers reporting real seconds (overhead_ms is the scheduler's);
one has the automatic budget, its workers' seconds modelled so that the cost model keeps real
windows (its overhead_ms means nothing; its round_ms is the scheduler's with the model at work).
"""
from __future__ import annotations

import statistics

import pytest

from hetspec.benchmarks.micro.echo_engine import MISS_EVERY, PROMPT, EchoEngine
from hetspec.benchmarks.micro.echo_workers import EchoSpec, echo_sequence

GAMMA = 5
NEW_TOKENS = 256
CALLS = 5
GREEDY = {"temperature": 0.0}
SAMPLED = {"temperature": 0.7, "top_p": 0.9}   # unkeyed: the workers' one-hot rows make it greedy's tokens


@pytest.fixture(scope="module")
def fixed():
    with EchoEngine({"gamma": GAMMA}, EchoSpec(miss_every=MISS_EVERY)) as engine:
        yield engine


@pytest.fixture(scope="module")
def auto():
    with EchoEngine({"gamma": "auto"}, EchoSpec(miss_every=MISS_EVERY, seconds="modelled")) as engine:
        yield engine


def measure(benchmark, engine: EchoEngine, mode: str, sampling: dict):
    runs = []

    def one_request():
        run = engine.generate(PROMPT, mode=mode, max_new_tokens=NEW_TOKENS, **sampling)
        runs.append(run)
        return run

    benchmark.pedantic(one_request, rounds=CALLS, warmup_rounds=1, iterations=1)
    runs = runs[1:]                                   # the warm-up's
    for name in ("round_ms", "overhead_ms"):
        values = [getattr(run, name) for run in runs]
        benchmark.extra_info[name] = round(min(values), 4)
        benchmark.extra_info[f"{name}_median"] = round(statistics.median(values), 4)
    benchmark.extra_info.update({k: v for k, v in runs[-1].summary().items() if k not in ("round_ms", "overhead_ms")})
    print(f"\n{benchmark.name} {benchmark.extra_info}")   # shown with -s
    for run in runs:
        check(run, engine, mode)
    return runs


def check(run, engine: EchoEngine, mode: str) -> None:
    """Every request gives the echo rule's tokens (the target's greedy output), streamed as
    returned; a speculative one never rests, speculates in every round once the draft has its
    prompt (before that, the target decodes alone: a few rounds, as the draft's process is
    scheduled), and keeps most of its draft tokens."""
    expected = echo_sequence(PROMPT, NEW_TOKENS, engine.echo.vocab)
    assert run.finished.token_ids == expected
    assert run.streamed == expected
    stats = run.stats
    assert stats["finish_reason"] == "length" and stats["fallback"] is None
    if mode == "target":
        assert stats["spec_rounds"] == 0 and stats["rounds"] == NEW_TOKENS - 1
        return
    assert stats["rested"] == 0 and stats["target_only_rounds"] < stats["rounds"] // 4
    assert 0.5 < stats["acceptance_rate"] < 1.0


@pytest.mark.parametrize("mode", ["duodec", "sequential", "target"])
def test_round_fixed_gamma(benchmark, fixed, mode):
    benchmark.extra_info.update(gamma=GAMMA, miss_every=MISS_EVERY)
    measure(benchmark, fixed, mode, GREEDY)


@pytest.mark.parametrize("mode", ["duodec", "sequential"])
def test_round_auto_gamma(benchmark, auto, mode):
    benchmark.extra_info.update(gamma="auto", miss_every=MISS_EVERY)
    measure(benchmark, auto, mode, GREEDY)


def test_round_sampled(benchmark, fixed):
    """Speculative sampling (unkeyed): probability rows cross in shared memory both ways."""
    benchmark.extra_info.update(gamma=GAMMA, miss_every=MISS_EVERY, **SAMPLED)
    measure(benchmark, fixed, "duodec", SAMPLED)
