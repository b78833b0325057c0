"""Prefilling with a second copy of the draft's weights, then handing the KV
cache over, with the real SmolLM2 GGUF in llama.cpp: the handover itself is
exact, from a fresh prompt or after a kept prefix, and short inputs skip it."""
import os

import numpy as np
import pytest

from hetspec.models import resolve_model
from hetspec.workers.draft.gguf_conversion import convert_gguf
from hetspec.workers.draft.llama_cpp import LlamaCppModel
from hetspec.workers.draft.split_prefill import SplitPrefillModel

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def q8_path(tmp_path_factory):
    model = resolve_model("builtin:smollm2")
    return convert_gguf(os.path.join(model.path, model.gguf_file), "q8_0", str(tmp_path_factory.mktemp("gguf")), 2)


class Recorded:
    """A model whose passes and cache moves are written down: (method, tokens or length, pos)."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def forward(self, tokens, pos):
        self.calls.append(("forward", len(tokens), pos))
        return self.model.forward(tokens, pos)

    def export_cache(self, length):
        self.calls.append(("export_cache", length))
        return self.model.export_cache(length)

    def import_cache(self, state):
        self.calls.append(("import_cache",))
        self.model.import_cache(state)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def taken(self) -> list:
        calls, self.calls = self.calls, []
        return calls


def test_handover_equals_running_the_same_passes_in_one_model(q8_path):
    """With the same weights in both copies, splitting a prefill across them
    gives what one model computes with the same passes, bit for bit; and the
    prompt is computed by the prefill copy, whose cache the drafting copy takes."""
    reference = LlamaCppModel(q8_path, 1024, 1)
    drafting, prefill = Recorded(LlamaCppModel(q8_path, 1024, 1)), Recorded(LlamaCppModel(q8_path, 1024, 1))
    split = SplitPrefillModel(drafting, prefill)
    prompt = np.random.default_rng(0).integers(100, 40000, 300).tolist()
    # a fresh prompt: all but its last token in the prefill copy, the last in the drafting copy
    reference.forward(prompt[:99], 0)
    assert np.array_equal(reference.forward(prompt[99:100], 99), split.forward(prompt[:100], 0))
    assert prefill.taken() == [("forward", 99, 0), ("export_cache", 99)]
    assert drafting.taken() == [("import_cache",), ("forward", 1, 99)]
    # a few tokens: the drafting copy alone
    assert np.array_equal(reference.forward(prompt[100:105], 100), split.forward(prompt[100:105], 100))
    assert prefill.taken() == []
    assert drafting.taken() == [("forward", 5, 100)]
    # a long continuation after a kept prefix: the prefix travels to the prefill copy and back
    reference.forward(prompt[105:199], 105)
    assert np.array_equal(reference.forward(prompt[199:200], 199), split.forward(prompt[105:200], 105))
    assert drafting.taken() == [("export_cache", 105), ("import_cache",), ("forward", 1, 199)]
    assert prefill.taken() == [("import_cache",), ("forward", 94, 105), ("export_cache", 199)]
    # and drafting goes on from the handed-over cache
    for pos in range(200, 205):
        assert np.array_equal(reference.forward([prompt[pos]], pos), split.forward([prompt[pos]], pos))
    assert prefill.taken() == []
    for model in (reference, split):
        model.close()
