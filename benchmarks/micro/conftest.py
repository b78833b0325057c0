"""The suites' fixtures: the engine config, a real context, the scheduler built in this process over the engine's
own workers, and tiny random models for the suites that time what is beside the model."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

from hetspec.benchmarks.bench.data import load_prompts
from hetspec.benchmarks.bench.settings import engine_config, split_config
from hetspec.config import load_config
from hetspec.launcher import Launcher
from hetspec.models import resolve_model
from hetspec.scheduler.scheduler import Scheduler
from hetspec.scheduler.tokenizer import Tokenizer

CONTEXT_TOKENS = 256     # the engine's own calibration context (hetspec.scheduler.scheduler.CALIBRATION_CONTEXT)
GAMMA = 5                # the budget the committed SmolLM2 reports chose (4-5); a verify pass holds GAMMA + 1 tokens
VOCABS = {"smollm2": 49152, "gemma3-270m": 262144}     # by the tokenizer a random model of that vocabulary borrows


def tiny_config(vocab: str = "smollm2", **decoding) -> dict:
    """One tiny random model (a single narrow layer) as both draft and target: the workers compute little and the
    draft always agrees; speculation "always", so that every round speculates."""
    model = f"random:vocab={VOCABS[vocab]},hidden=16,layers=1,heads=2,tokenizer={vocab}"
    return {"draft": {"backend": "torch", "model": model}, "target": {"model": model},
            "decoding": {"speculation": "always", **decoding}}


@contextlib.contextmanager
def in_process_scheduler(config: dict):
    """The engine's workers started as the launcher starts them, the scheduler in this process with its links
    (scheduler.target, scheduler.draft) at hand."""
    affinity, launcher, scheduler = os.sched_getaffinity(0), Launcher(load_config(config)), None
    try:
        scheduler = Scheduler(launcher.run_spec())
        scheduler.start()
        yield scheduler
    finally:
        if scheduler is not None:
            scheduler.close()
        launcher.stop()
        os.sched_setaffinity(0, affinity)      # the scheduler pinned this process


def beside_the_model(benchmark, worker_s: list[float], **info) -> None:
    """The worker's median seconds for its pass, and the rest of the measured median (none when disabled)."""
    worker = float(np.median(worker_s))
    if benchmark.stats is not None:
        benchmark.extra_info.update(**info, worker_median_ms=1e3 * worker,
                                    beside_the_model_ms=1e3 * (benchmark.stats.stats.median - worker))


@pytest.fixture(scope="session")
def bench_config() -> dict:
    """HETSPEC_BENCH_CONFIG and HETSPEC_BENCH_DTYPE, or the embedded default."""
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
    """The scheduler in this process over the config's workers; a suite's DECODING overrides [decoding]."""
    config = {section: dict(values) for section, values in bench_config.items()}
    config.setdefault("decoding", {}).update(getattr(request.module, "DECODING", {}))
    with in_process_scheduler(config) as scheduler:
        yield scheduler
