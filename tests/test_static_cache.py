"""The static-cache transformers target ([target] passes = "static", and "captured": the
same passes recorded, replayed as CUDA graphs on a GPU, run as recorded here): its
caches allocated once per request, rollbacks moving a length, windows padded to a few
sizes. It computes what the growing cache does (the same argmax at every position,
logits within float32 rounding) through rollbacks, padding, a sliding window, several
requests' caches and KV export; and an engine running it is exactly the target's own
greedy output in every mode, with a draft that agrees and one that does not."""
import numpy as np
import pytest
import torch
from test_engine_greedy import PROMPTS, SETTINGS

import hetspec
from hetspec.core.errors import ConfigError
from hetspec.workers.common.kv_model import KVModel, StaticKVModel, padded_sizes
from hetspec.workers.target.captured import CapturedKVModel

from helpers import TARGET, WEAK_DRAFT, explain_mismatch, load_reference, random_engine_config, reference_greedy

# (tokens run, positions rolled back first): windows of every padded size and between
# them, rollbacks within and past the last pass, and a prompt longer than any window
PASSES = [(30, 0), (5, 0), (1, 0), (6, 4), (1, 0), (8, 9), (3, 0), (9, 2), (40, 0), (2, 7), (16, 0), (7, 16)]
SLIDING = "random:arch=gemma3,window=8,layers=4,seed=3"


def test_padded_sizes_are_powers_of_two_then_the_longest_window():
    assert padded_sizes(1) == (1,) and padded_sizes(9) == (1, 2, 4, 8, 9) and padded_sizes(16) == (1, 2, 4, 8, 16)
    assert padded_sizes(33)[-2:] == (32, 33)


@pytest.mark.parametrize("static_model", [StaticKVModel, CapturedKVModel])
@pytest.mark.parametrize("spec", ["random:seed=3", SLIDING])
def test_the_static_cache_computes_what_the_growing_one_does(spec, static_model):
    growing, static = KVModel(load_reference(spec)), static_model(load_reference(spec), "cpu", 200, 9)
    rng, pos = np.random.default_rng(0), 0
    for n, back in PASSES:                             # Gemma 3's window is 8: most passes reach past it
        pos -= back
        tokens = rng.integers(0, 320, n).tolist()
        want, got = growing.forward(tokens, pos), static.forward(tokens, pos)
        assert got.shape == want.shape and torch.equal(got.argmax(-1), want.argmax(-1)), (n, back)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        pos += n
    assert static.length == growing.length == pos
    assert static.forward([5], pos, all_logits=False).shape == (1, static.n_vocab)
    for (k1, v1), (k2, v2) in zip(static.layer_kv(pos), growing.layer_kv(pos)):   # the KV a draft takes over
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("static_model", [StaticKVModel, CapturedKVModel])
def test_each_request_keeps_its_own_cache_allocated_once(static_model):
    static = static_model(load_reference("random:seed=3"), "cpu", 128, 5)
    alone = static_model(load_reference("random:seed=3"), "cpu", 128, 5)
    first, second = list(range(10, 30)), list(range(200, 212))
    static.forward(first, 0)
    keys = static.cache.layers[0].keys
    static.use(1)
    static.forward(second, 0)
    static.use(0)                                      # back to the first: its cache as it was, not a new one
    assert static.cache.layers[0].keys is keys and static.length == len(first)
    got = static.forward([3, 4, 5], len(first))
    alone.forward(first, 0)
    assert torch.equal(got, alone.forward([3, 4, 5], len(first)))
    static.forward([1, 2], 0)                          # a new request in this slot reuses the memory
    assert static.cache.layers[0].keys is keys
    with pytest.raises(ValueError, match="do not fit"):
        static.forward(list(range(130)), 0)


def test_a_recording_belongs_to_its_cache():
    model = CapturedKVModel(load_reference("random:seed=3"), "cpu", 128, 5)
    for cache in (0, 1):
        model.use(cache)
        model.forward(list(range(10, 20)), 0)             # a prompt: run as it is
        model.forward([3, 4, 5], 10)
    assert sorted(model._recorded) == [(0, 4), (1, 4)]
    model.forget()                                     # cache 1's, say after a failed pass
    assert sorted(model._recorded) == [(0, 4)]


def _recordable(spec):
    """A captured model with two caches past their prompts; its recorded passes, a request's
    and the batch's, each as a function of the padded size with its inputs staged."""
    model = CapturedKVModel(load_reference(spec), "cpu", 128, 9, caches=2)
    for cache in (0, 1):
        model.use(cache)
        model.forward(list(range(3 + cache, 40)), 0)

    def one(size):
        model._staged[0] = 37 - size                       # rolls back over the last pass each time
        model._staged[1:1 + size] = torch.arange(7, 7 + size)
        return model._pass

    def batch(size):
        model._rows_staged[:, 0] = torch.tensor([37 - size, 30])
        model._rows_staged[:, 1:1 + size] = torch.arange(7, 7 + size)
        return lambda size: model._rows_pass(2, size)
    return model, {"one": one, "batch": batch}


@pytest.mark.parametrize("kind", ["one", "batch"])
@pytest.mark.parametrize("spec", ["random:seed=3", SLIDING])
def test_every_recorded_pass_traces_as_one_graph(spec, kind):
    """What a CUDA graph needs, checked on the CPU: torch.compile(fullgraph=True) traces
    the recorded pass (a request's: the rewind to the staged start, the model over the
    static cache; a batch's over the caches' rows) at every padded size with no graph
    break and no host sync (either would raise here), and the traced pass computes what
    the eager one does. (Dynamo's tracing alone: the "eager" backend compiles no kernels.)"""
    import torch._dynamo

    model, stage = _recordable(spec)
    torch._dynamo.reset()
    try:
        for size in model.sizes:
            run = stage[kind](size)
            traced = torch.compile(run, fullgraph=True, dynamic=False, backend="eager")
            with torch.inference_mode():
                want, got = run(size), traced(size)
            assert torch.equal(got, want), size
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["one", "batch"])
@pytest.mark.parametrize("spec", ["random:seed=3", SLIDING])
def test_a_recorded_pass_reads_nothing_back_to_the_host_while_captured(spec, kind, monkeypatch):
    """A CUDA graph cannot hold a host sync (a tensor's value read in Python): recording
    would fail. transformers takes other branches while a CUDA stream captures; here,
    told it captures, the recorded pass must ask no tensor for its value (an eager
    pass asks one, the mask's "is the cache empty")."""
    import transformers.utils.import_utils as import_utils
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = []
    value_ops = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.is_nonzero.default}

    class ValueReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in value_ops:
                reads.append(func)
            return func(*args, **(kwargs or {}))

    run = _recordable(spec)[1][kind](4)
    for capturing in (False, True):
        monkeypatch.setattr(import_utils, "is_cuda_stream_capturing", lambda: capturing)
        reads.clear()
        with torch.inference_mode(), ValueReads():
            run(4)
        assert not reads if capturing else (kind == "batch" or reads), (capturing, reads)   # an eager pass reads one


@pytest.fixture(scope="module", params=[("static", "weak-draft"), ("captured", "same-draft"), ("captured", "weak-draft")],
                ids="-".join)
def engine(request):
    passes, draft = request.param
    config = random_engine_config(draft=TARGET if draft == "same-draft" else WEAK_DRAFT,
                                  keep_drafting=draft == "weak-draft")
    config["target"].update(backend="transformers", passes=passes)
    with hetspec.launch(config) as engine:
        kernels = engine.info["target"]["kernels"]
        assert "static KV cache, windows padded to 1, 2, 4, 8" in kernels
        assert ("recorded passes run eagerly (no CUDA)" in kernels) == (passes == "captured")
        yield engine


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_an_engine_on_the_static_cache_is_the_targets_greedy_output(engine, target_model, settings):
    for prompt in PROMPTS:
        expected = reference_greedy(target_model, prompt, 40)
        result = engine.generate(prompt, max_new_tokens=40, **settings)
        assert result.token_ids == expected, explain_mismatch(target_model, prompt, result.token_ids, expected)


def test_a_seed_gives_the_same_tokens_in_every_mode(engine):
    params = dict(max_new_tokens=32, temperature=0.8, seed=7)
    alone = engine.generate(PROMPTS[1], mode="target", **params).token_ids
    for mode in ("sequential", "duodec"):
        assert engine.generate(PROMPTS[1], mode=mode, **params).token_ids == alone


def test_passes_are_the_transformers_targets_own():
    with pytest.raises(ConfigError, match=r"passes = 'captured' is the transformers target's"):
        hetspec.launch({"target": {"backend": "native", "passes": "captured"}})
    with pytest.raises(ConfigError, match=r"\[target\] passes must be one of auto, eager, static, captured, got 'graphs'"):
        hetspec.launch({"target": {"passes": "graphs"}})
