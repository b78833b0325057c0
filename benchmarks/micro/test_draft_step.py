"""One draft step (gamma of them make a round): the draft worker's model takes one token after the
context and the next is taken greedily; each step re-evaluates the same position."""
from __future__ import annotations

import numpy as np
import pytest

from hetspec.benchmarks.micro.conftest import CONTEXT_TOKENS
from hetspec.models import resolve_model


@pytest.fixture(scope="module")
def draft_state(resolved, context_ids, tmp_path_factory):
    if resolved.draft.backend not in ("native", "llama.cpp"):
        pytest.skip(f"the draft backend is {resolved.draft.backend}, not native or llama.cpp")
    from hetspec.ipc.specs import DraftSpec
    from hetspec.workers.draft.worker import DraftState

    d = resolved.draft
    state = DraftState(DraftSpec(backend=d.backend, model=resolve_model(d.model, "draft"), cores=[0], threads=1,
                                 n_ctx=CONTEXT_TOKENS + 64, weights=d.weights,
                                 scratch_dir=str(tmp_path_factory.mktemp("draft"))))
    state.model.forward(context_ids, 0)
    yield state
    state.model.close()


def test_draft_step(benchmark, draft_state, context_ids):
    model, token = draft_state.model, context_ids[-1]

    def step():
        return int(np.argmax(model.forward([token], CONTEXT_TOKENS)))

    benchmark.extra_info.update(context=CONTEXT_TOKENS, threads=1, kernels=draft_state.kernels)
    assert 0 <= benchmark(step) < model.n_vocab
