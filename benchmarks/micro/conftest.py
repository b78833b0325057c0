"""The suites' fixtures: the engine config, a real context, and the scheduler built in this process."""
from __future__ import annotations

import os

import pytest

from hetspec.benchmarks.bench.data import load_prompts
from hetspec.benchmarks.bench.settings import engine_config, split_config
from hetspec.benchmarks.micro.echo_engine import EchoEngine
from hetspec.config import load_config
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer

CONTEXT_TOKENS = 256     # the engine's own calibration context (hetspec.scheduler.scheduler.CALIBRATION_CONTEXT)
GAMMA = 5                # the budget the committed SmolLM2 reports chose (4-5); a verify pass holds GAMMA + 1 tokens
VOCABS = {"smollm2": 49152, "gemma3": 262144}


@pytest.fixture(scope="session")
def bench_config() -> dict:
    config, _ = split_config(os.environ.get("HETSPEC_BENCH_CONFIG") or None)
    return engine_config(config, os.environ.get("HETSPEC_BENCH_DTYPE") or None)


@pytest.fixture(scope="session")
def resolved(bench_config):
    return load_config(bench_config)


@pytest.fixture(scope="session")
def context_ids(resolved) -> list[int]:
    """CONTEXT_TOKENS real tokens, from the first summarization prompt."""
    tokenizer = Tokenizer(resolve_model(resolved.target.model, "target"))
    text = load_prompts(["summarization"], limit=1)[0].text
    ids = tokenizer.encode_prompt(text)
    assert len(ids) >= CONTEXT_TOKENS
    return ids[:CONTEXT_TOKENS]


@pytest.fixture(scope="module")
def scheduler(bench_config, request):
    """The engine's workers started as the launcher starts them, the scheduler in this process with its links at
    hand (echo_engine.EchoEngine over the real workers); a suite's DECODING overrides [decoding]."""
    config = {section: dict(values) for section, values in bench_config.items()}
    config.setdefault("decoding", {}).update(getattr(request.module, "DECODING", {}))
    with EchoEngine(config=config) as engine:
        yield engine.scheduler
