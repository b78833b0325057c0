"""One verify pass of 1 and gamma + 1 tokens after the context, on one thread with the worker's own
kernels; each pass first crops the cache back, as a rejected window does."""
from __future__ import annotations

import pytest
import torch

from hetspec.benchmarks.micro.conftest import CONTEXT_TOKENS, GAMMA
from hetspec.ipc.specs import TargetSpec
from hetspec.models import resolve_model
from hetspec.workers.target.transformers_target import TransformersTarget


@pytest.fixture(scope="module")
def target(resolved, context_ids):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    state = TransformersTarget(TargetSpec(model=resolve_model(resolved.target.model, "target"), device="cpu",
                                          dtype=resolved.target.dtype, cores=[], threads=1,
                                          cpu_kernels=resolved.target.cpu_kernels))
    state.kv.forward(context_ids, 0, all_logits=False)
    yield state
    torch.set_num_threads(threads)


@pytest.mark.parametrize("n_tokens", [1, GAMMA + 1])
def test_verify_pass(benchmark, target, context_ids, n_tokens, resolved):
    window = (context_ids * 2)[CONTEXT_TOKENS - 1:CONTEXT_TOKENS - 1 + n_tokens]

    def verify():
        return target.kv.forward(window, CONTEXT_TOKENS - 1).argmax(dim=-1)

    benchmark.extra_info.update(context=CONTEXT_TOKENS, tokens=n_tokens, threads=1, dtype=resolved.target.dtype,
                                kernels=target.kernels)
    assert len(benchmark(verify)) == n_tokens
