"""One draft step: llama.cpp evaluates one token after a 256-token context and
the next token is taken greedily (what the draft worker does gamma times a round).
Each step re-evaluates the same position, so the cache never grows."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.micro.conftest import CONTEXT_TOKENS
from hetspec.models import resolve_model


@pytest.fixture(scope="module")
def draft_model(resolved, context_ids):
    if resolved.draft.backend != "llama.cpp":
        pytest.skip(f"the draft backend is {resolved.draft.backend}, not llama.cpp")
    from workers.llama_cpp_model import LlamaCppModel

    model = LlamaCppModel(resolve_model(resolved.draft.model, "draft").file, n_ctx=CONTEXT_TOKENS + 64, n_threads=1)
    model.forward(context_ids, 0)
    yield model
    model.close()


def test_draft_step(benchmark, draft_model, context_ids):
    token = context_ids[-1]

    def step():
        return int(np.argmax(draft_model.forward([token], CONTEXT_TOKENS)))

    benchmark.extra_info.update(context=CONTEXT_TOKENS, threads=1)
    assert 0 <= benchmark(step) < draft_model.n_vocab
