"""Prefilling with a second copy of the draft's weights, then handing the KV
cache over, with the real SmolLM2 GGUF in llama.cpp: the handover itself is
exact, from a fresh prompt or after a kept prefix, and short inputs skip it."""
import os

import numpy as np
import pytest

from hetspec.models import resolve_model
from workers.gguf_conversion import convert_gguf
from workers.llama_cpp_model import LlamaCppModel
from workers.split_prefill import SplitPrefillModel

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def q8_path(tmp_path_factory):
    model = resolve_model("builtin:smollm2")
    return convert_gguf(os.path.join(model.path, model.gguf_file), "q8_0", str(tmp_path_factory.mktemp("gguf")), 2)


def test_handover_equals_running_the_same_passes_in_one_model(q8_path):
    """With the same weights in both copies, splitting a prefill across them
    gives what one model computes with the same passes, bit for bit."""
    reference = LlamaCppModel(q8_path, 1024, 1)
    split = SplitPrefillModel(LlamaCppModel(q8_path, 1024, 1), LlamaCppModel(q8_path, 1024, 1))
    prompt = np.random.default_rng(0).integers(100, 40000, 300).tolist()
    # a fresh prompt: all but its last token in the prefill copy
    reference.forward(prompt[:99], 0)
    assert np.array_equal(reference.forward(prompt[99:100], 99), split.forward(prompt[:100], 0))
    # a few tokens: the drafting copy alone
    assert np.array_equal(reference.forward(prompt[100:105], 100), split.forward(prompt[100:105], 100))
    assert split.handovers == 1
    # a long continuation after a kept prefix: the prefix travels to the prefill copy and back
    reference.forward(prompt[105:199], 105)
    assert np.array_equal(reference.forward(prompt[199:200], 199), split.forward(prompt[105:200], 105))
    assert split.handovers == 2
    # and drafting goes on from the handed-over cache
    for pos in range(200, 205):
        assert np.array_equal(reference.forward([prompt[pos]], pos), split.forward([prompt[pos]], pos))
    for model in (reference, split):
        model.close()
