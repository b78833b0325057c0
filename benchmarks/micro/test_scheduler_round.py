"""The scheduler's own time per round: the engine (hetspec.launch) on a tiny random model as draft and target
(conftest.tiny_config: little compute, the draft always agreeing), a 256-token request a call. extra_info
keeps round_ms (the call's wall over its rounds) and overhead_ms (the engine's overhead_s per speculative round: a
round's wall less its workers' seconds), best and median; one engine drafts gamma GAMMA, one has the automatic
budget."""
from __future__ import annotations

import statistics
import time

import pytest

import hetspec
from hetspec.benchmarks.micro.conftest import GAMMA, tiny_config

NEW_TOKENS = 256
CALLS = 5
PROMPT = list(range(1000, 1011))
GREEDY = {"temperature": 0.0}
SAMPLED = {"temperature": 0.7, "top_p": 0.9, "seed": 1}


@pytest.fixture(scope="module", params=[GAMMA, "auto"], ids=lambda g: f"gamma-{g}")
def engine(request):
    with hetspec.launch(tiny_config(gamma=request.param)) as engine:
        engine.reference = engine.generate(PROMPT, max_new_tokens=NEW_TOKENS, mode="target", **GREEDY).token_ids
        yield engine


def measure(benchmark, engine, mode: str, sampling: dict) -> list:
    runs = []

    def one_request():
        start = time.perf_counter()
        result = engine.generate(PROMPT, mode=mode, max_new_tokens=NEW_TOKENS, **sampling)
        runs.append((time.perf_counter() - start, result))
        return result

    benchmark.pedantic(one_request, rounds=CALLS, warmup_rounds=1, iterations=1)
    runs = runs[1:] or runs                           # the warm-up's (none with --benchmark-disable)
    figures = {"round_ms": [1e3 * wall / max(r.stats["rounds"], 1) for wall, r in runs],
               "overhead_ms": [1e3 * r.stats["overhead_s"] / max(r.stats["spec_rounds"], 1) for _, r in runs]}
    for name, values in figures.items():
        benchmark.extra_info[name] = round(min(values), 4)
        benchmark.extra_info[f"{name}_median"] = round(statistics.median(values), 4)
    stats = runs[-1][1].stats
    benchmark.extra_info.update({k: stats[k] for k in ("gamma", "rounds", "spec_rounds", "new_tokens")})
    print(f"\n{benchmark.name} {benchmark.extra_info}")   # shown with -s
    return [result for _, result in runs]


def check(results: list, engine, mode: str, greedy: bool = True) -> None:
    """Greedy, every request gives the target alone's tokens; a speculative one never rests and speculates."""
    for result in results:
        assert result.stats["fallback"] is None and 0 < len(result.token_ids) <= NEW_TOKENS
        if greedy:
            assert result.token_ids == engine.reference
        if mode != "target":
            assert result.stats["rested"] == 0 and result.stats["spec_rounds"] > 0


@pytest.mark.parametrize("mode", ["duodec", "sequential", "target"])
def test_round(benchmark, engine, mode):
    check(measure(benchmark, engine, mode, GREEDY), engine, mode)


def test_round_sampled(benchmark, engine):
    """Speculative sampling: probability rows cross in shared memory both ways."""
    benchmark.extra_info.update(SAMPLED)
    check(measure(benchmark, engine, "duodec", SAMPLED), engine, "duodec", greedy=False)
