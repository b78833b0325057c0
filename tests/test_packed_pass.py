"""The transformers target's one pass over several requests (workers/target/packed_pass.py,
and a captured target's recorded batch pass, captured.py): each request's rows are what
its own pass alone gives, through prompts joining, windows of every length, rollbacks and
batches without some requests, over a growing, a static and a captured cache, on a Llama
and on a Gemma 3 past its sliding window; and the model runs once a batch."""
import numpy as np
import pytest
import torch

from hetspec.workers.common.hf_compat import decoder
from hetspec.workers.common.kv_model import KVModel, StaticKVModel
from hetspec.workers.target.captured import CapturedKVModel
from hetspec.workers.target.packed_pass import forward_batch

from helpers import load_reference

N_CTX, MAX_WINDOW = 128, 8


def _kv(kind, lm):
    if kind == "captured":
        return CapturedKVModel(lm, "cpu", N_CTX, MAX_WINDOW, caches=3)
    return KVModel(lm) if kind == "eager" else StaticKVModel(lm, "cpu", N_CTX, MAX_WINDOW)


def _forward_batch(kv, windows):
    """A captured model's recorded batch pass, the others' packed pass."""
    return kv.forward_batch(windows) if isinstance(kv, CapturedKVModel) else forward_batch(kv, windows)


@pytest.mark.parametrize("kind", ["eager", "static", "captured"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_packed_batch_gives_each_request_its_rows_alone(arch, kind):
    lm = load_reference(f"random:arch={arch},seed=3")
    alone, packed = _kv(kind, lm), _kv(kind, lm)
    passes = []
    decoder(lm).register_forward_pre_hook(lambda *_: passes.append(1))    # the model under the output layer
    rng = np.random.default_rng(0)
    lengths = [0, 0, 0]

    def window(cache, n, back=0, rows=1):
        keep = max(0, lengths[cache] - back)
        return cache, [int(t) for t in rng.integers(1, 300, n)], keep, rows

    plan = [   # each window's (cache, tokens, rolled back, rows)
        [(0, 30, 0, 1), (1, 5, 0, 5)],                         # two prompts, one read whole
        [(0, 1, 0, 1), (1, 4, 0, 4), (2, 17, 0, 1)],           # a third joins
        [(0, 5, 1, 5), (1, 1, 0, 1), (2, 3, 0, 2)],            # a rollback
        [(2, 8, 0, 8), (0, 2, 3, 2), (1, 6, 0, 3)],
        [(0, 3, 0, 1), (2, 2, 1, 2)],                         # a batch without the second request
    ] + [[(c, 1 + (s + c) % 4, s % 2, 1) for c in range(3) if (s + c) % 5] for s in range(12)]
    for windows in plan:
        step = [window(*w) for w in windows]
        expected = []
        for cache, tokens, keep, rows in step:
            alone.use(cache)
            expected.append(alone.forward(tokens, keep)[-rows:])
        before = len(passes)
        got = _forward_batch(packed, step)
        assert len(passes) == before + 1                                  # one pass for the batch
        for (cache, tokens, keep, rows), want, have in zip(step, expected, got):
            assert have.shape == want.shape
            assert torch.equal(have.argmax(-1), want.argmax(-1))
            torch.testing.assert_close(have, want, rtol=0, atol=1e-4)
            lengths[cache] = keep + len(tokens)
    assert max(lengths) > 40                                              # past Gemma's window of 8
    if kind == "captured":                                                # windows ran as the recorded batch pass
        assert {key[:2] for key in packed._recorded} == {(3, 64)}                # 3 rows, every context within 64
    for cache in range(3):                                                # a lone pass after batches reads the same cache
        packed.use(cache)
        alone.use(cache)
        torch.testing.assert_close(packed.forward([7], lengths[cache]), alone.forward([7], lengths[cache]),
                                   rtol=0, atol=1e-4)
