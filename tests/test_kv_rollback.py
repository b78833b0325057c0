"""Rolling a KV cache back after a rejection must equal never having gone forward,
including Gemma 3's sliding-window layers once the window is full."""
import numpy as np
import pytest
import torch

from hetspec.core.sampling import GREEDY
from hetspec.ipc.messages import BranchPlan
from hetspec.ipc.specs import ModelSpec
from hetspec.workers.common import kv_cache
from hetspec.workers.common.kv_model import KVModel
from hetspec.workers.draft.drafter import Drafter
from hetspec.workers.draft.torch_model import TorchDraftModel

from helpers import load_reference


class CountingModel(TorchDraftModel):
    """Counts forward passes, to check what the drafter re-runs."""
    passes = 0

    def forward(self, tokens, pos):
        self.passes += 1
        return super().forward(tokens, pos)


@pytest.mark.parametrize("spec", ["random:seed=3", "random:arch=gemma3,window=8,layers=4,seed=3"])
def test_crop_then_continue_equals_fresh_run(spec):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 320, 40).tolist()
    other = rng.integers(0, 320, 6).tolist()
    rolled = KVModel(load_reference(spec))
    rolled.forward(tokens[:30], 0)
    rolled.forward(tokens[30:], 30)                 # well past the 8-token window
    logits = rolled.forward(other, 25)              # reject everything after position 25
    fresh = KVModel(load_reference(spec))
    expected = fresh.forward(tokens[:25] + other, 0)[-len(other):]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    # and greedy continuations agree step by step
    a, b = int(logits[-1].argmax()), int(expected[-1].argmax())
    for step in range(8):
        assert a == b
        pos = 31 + step
        a = int(rolled.forward([a], pos)[-1].argmax())
        b = int(fresh.forward([b], pos)[-1].argmax())


def _greedy_chain(spec, context, n):
    model = KVModel(load_reference(spec))
    logits = model.forward(context, 0)[-1]
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = model.forward([out[-1]], len(context) + len(out) - 1)[-1]
    return out


def test_drafter_syncs_by_longest_common_prefix():
    spec = "random:seed=4"
    model = CountingModel(ModelSpec("random", random=_spec(4)))
    drafter = Drafter(model, 256)
    context = np.arange(10, 30, dtype=np.int32)
    first = drafter.draft(context, 5, GREEDY).branches[0]
    assert first == _greedy_chain(spec, context.tolist(), 5)
    # the scheduler's context diverges from what the draft cached: it must re-run only the tail
    changed = np.concatenate([context[:12], [7, 8, 9]]).astype(np.int32)
    model.passes = 0
    out = drafter.draft(changed, 5, GREEDY)
    assert out.branches[0] == _greedy_chain(spec, changed.tolist(), 5)
    assert model.passes == 5              # one pass re-runs the changed tail, then one per new token


def test_speculative_branches_start_with_top_candidates():
    spec = "random:seed=5"
    drafter = Drafter(TorchDraftModel(ModelSpec("random", random=_spec(5))), 256)
    context = np.arange(40, 60, dtype=np.int32)
    out = drafter.draft(context, 9, GREEDY, BranchPlan(3, 4, 0.8))
    assert [len(b) for b in out.branches] == [3, 3, 3]
    first_logits = KVModel(load_reference(spec)).forward(context.tolist(), 0)[-1]
    top3 = torch.argsort(first_logits, descending=True)[:3].tolist()
    assert [b[0] for b in out.branches] == top3
    for branch in out.branches:           # each branch continues greedily from its own first token
        assert branch[1:] == _greedy_chain(spec, context.tolist() + [branch[0]], 2)
    # the most likely branch is drafted last, so its KV entries are what stays cached
    assert drafter.cached[:drafter.n_cached].tolist()[-2:] == out.branches[0][:2]


def _spec(seed):
    from hetspec.models import RANDOM_DEFAULTS
    return {**RANDOM_DEFAULTS, "seed": seed}


def test_extension_continues_the_likeliest_branch():
    spec = "random:seed=5"
    drafter = Drafter(TorchDraftModel(ModelSpec("random", random=_spec(5))), 256)
    context = np.arange(40, 60, dtype=np.int32)
    out = drafter.draft(context, 6, GREEDY, BranchPlan(2, 4, 0.8))
    likeliest = list(out.branches[0])
    grown = [token for token, _ in drafter.extend(len(likeliest) + 3)]
    assert len(grown) == 3
    # as if the branch had been drafted that long in the first place
    assert likeliest[1:] + grown == _greedy_chain(spec, context.tolist() + [likeliest[0]], len(likeliest) + 2)


@pytest.mark.parametrize("spec", ["random:seed=3", "random:arch=gemma3,window=8,layers=4,seed=3"])
def test_growing_cache_computes_what_transformers_cache_does(spec):
    """Same logits, bit for bit, as transformers' own DynamicCache, through growth
    past the first buffer, rollbacks, and passes of one and several tokens."""
    from transformers import DynamicCache

    rng = np.random.default_rng(1)
    ours, theirs = KVModel(load_reference(spec)), KVModel(load_reference(spec))
    theirs._new_cache = DynamicCache
    pos = 0
    for n, back in [(300, 0), (5, 0), (1, 0), (6, 4), (1, 0), (8, 9), (3, 0)]:
        pos -= back
        tokens = rng.integers(0, 320, n).tolist()
        a, b = ours.forward(tokens, pos), theirs.forward(tokens, pos)
        assert torch.equal(a, b), (n, back)
        pos += n
    assert isinstance(ours.cache.layers[0], kv_cache.GrowingLayer)
    assert ours.cache.get_seq_length() == theirs.cache.get_seq_length() == pos
