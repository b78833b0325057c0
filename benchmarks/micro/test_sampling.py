"""One row's draw after the target's logits, unkeyed or keyed, with and without a top-p nucleus; random
logits stand in, as the cost depends on the vocabulary and the support, not the values."""
from __future__ import annotations

import numpy as np
import pytest

from hetspec.benchmarks.micro.conftest import VOCABS
from hetspec.core.sampling import draw_keyed, probabilities, sample


@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.parametrize("vocab", list(VOCABS))
@pytest.mark.parametrize("rule", ["unkeyed", "keyed"])
def test_draw_one_row(benchmark, rule, vocab, top_p):
    rng = np.random.default_rng(0)
    logits = (4 * rng.standard_normal((1, VOCABS[vocab]))).astype(np.float32)
    positions = iter(range(10**9))

    def draw():
        probs = probabilities(logits, 0.7, 0, top_p)[0]
        return sample(probs, rng) if rule == "unkeyed" else draw_keyed(probs, 1, next(positions))

    benchmark.extra_info.update(vocab=VOCABS[vocab], top_p=top_p, rule=rule,
                                support=int(np.count_nonzero(probabilities(logits, 0.7, 0, top_p))))
    assert 0 <= benchmark(draw) < VOCABS[vocab]
