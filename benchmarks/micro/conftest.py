"""Shared fixtures: the engine config, a realistic context, the models."""
from __future__ import annotations

import os

import pytest

from hetspec.benchmarks.data import load_prompts
from hetspec.benchmarks.settings import engine_config, split_config
from hetspec.config import load_config
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer

CONTEXT_TOKENS = 256     # the engine's own calibration context (hetspec.scheduler.service.CALIBRATION_CONTEXT)
GAMMA = 5                # the budget the committed SmolLM2 reports chose (4-5); a verify pass holds GAMMA + 1 tokens


@pytest.fixture(scope="session")
def bench_config() -> dict:
    config, _ = split_config(os.environ.get("HETSPEC_BENCH_CONFIG") or None)
    return engine_config(config, os.environ.get("HETSPEC_BENCH_DTYPE") or None)


@pytest.fixture(scope="session")
def resolved(bench_config):
    return load_config(bench_config)


@pytest.fixture(scope="session")
def context_ids(resolved) -> list[int]:
    """CONTEXT_TOKENS real tokens: the first summarization prompt, which is long enough."""
    tokenizer = Tokenizer(resolve_model(resolved.target.model, "target"))
    text = load_prompts(["summarization"], limit=1)[0].text
    ids = tokenizer.encode_prompt(text)
    assert len(ids) >= CONTEXT_TOKENS
    return ids[:CONTEXT_TOKENS]
