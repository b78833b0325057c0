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

from helpers import FULL, TARGET, WEAK_DRAFT, explain_mismatch, load_reference, random_engine_config, reference_greedy

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


def test_recordings_are_shared_by_every_cache_and_a_lone_request_runs_in_the_first_row():
    """Three caches, each a lone request in turn: each is moved into row 0 and runs the one
    recording of a row at its size and span, and computes what its own growing cache does."""
    lm = load_reference("random:seed=3")
    model, growing = CapturedKVModel(lm, "cpu", 128, 5, caches=3), KVModel(lm)
    assert model.row_counts == (1, 3) and model.spans == (64, 192)
    for cache in (0, 1, 2):
        for kv in (model, growing):
            kv.use(cache)
            kv.forward(list(range(10 + cache, 60)), 0)     # a prompt, run as it is
    for step in range(3):
        for cache in (2, 0, 1):
            model.use(cache)
            growing.use(cache)
            tokens, pos = [3 + step, 4, 5], 50 - cache + 3 * step
            got, want = model.forward(tokens, pos), growing.forward(tokens, pos)
            assert model.row_of[cache] == 0
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert sorted(model._recorded) == [(1, 64, 4)]        # every cache's windows: one recording
    model.use(1)
    model.forget()                                     # after a failed pass: the cache goes, the recordings stay
    assert sorted(model._recorded) == [(1, 64, 4)]


def test_a_span_covers_the_passes_context_and_rows_move_back_and_forth():
    """Windows whose context passes the short span run over the capacity; a batch of three
    after lone requests, and lone requests after it, each over its own cache's keys."""
    lm = load_reference("random:seed=3")
    model, growing = CapturedKVModel(lm, "cpu", 128, 5, caches=3), KVModel(lm)
    for cache in (0, 1, 2):
        for kv in (model, growing):
            kv.use(cache)
            kv.forward(list(range(5, 70 + cache)), 0)
    windows = [(2, [1, 2], 60, 2), (0, [3], 65, 1), (1, [4, 5, 6], 66, 3)]
    for got, (cache, tokens, keep, rows) in zip(model.forward_batch(windows), windows):
        growing.use(cache)
        torch.testing.assert_close(got, growing.forward(tokens, keep)[-rows:], atol=1e-4, rtol=1e-4)
    for cache, pos in ((1, 69), (2, 62), (0, 66)):
        for kv in (model, growing):
            kv.use(cache)
        torch.testing.assert_close(model.forward([9], pos), growing.forward([9], pos), atol=1e-4, rtol=1e-4)
        assert model.row_of[cache] == 0 and sorted(model.cache_at) == [0, 1, 2]
    assert sorted(model._recorded) == [(1, 64, 1), (1, 192, 1), (3, 192, 4)]


def _recordable(spec):
    """A captured model with two caches past their prompts; its recorded passes, a request's
    (one row) and a batch's (two), each as a function of the padded size with its inputs staged."""
    model = CapturedKVModel(load_reference(spec), "cpu", 128, 9, caches=2)
    for cache in (0, 1):
        model.use(cache)
        model.forward(list(range(3 + cache, 40)), 0)

    def staged(count, starts):
        def stage(size):
            model._staged[:, 0] = torch.tensor(starts)      # rolls back over the last pass each time
            model._staged[:, 1:1 + size] = torch.arange(7, 7 + size)
            return lambda size: model._rows_pass(count, model.spans[-1], size)
        return stage
    return model, {"one": staged(1, [37, 128]), "batch": staged(2, [33, 30])}


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
    would fail. transformers takes other branches while a CUDA stream captures; told it
    captures or not, the recorded pass asks no tensor for its value."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers.utils import import_utils

    reads = []
    value_ops = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.is_nonzero.default}

    class ValueReads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in value_ops:
                reads.append(func)
            return func(*args, **(kwargs or {}))

    run = _recordable(spec)[1][kind](4)
    for capturing in (False, True):
        monkeypatch.setattr(import_utils, "is_cuda_stream_capturing", lambda capturing=capturing: capturing)
        reads.clear()
        with torch.inference_mode(), ValueReads():
            run(4)
        assert not reads, (capturing, reads)


@pytest.fixture(scope="module", params=[("static", "weak-draft"), pytest.param(("captured", "same-draft"), marks=FULL),
                                        ("captured", "weak-draft")], ids="-".join)
def engine(request):
    passes, draft = request.param
    config = random_engine_config(draft=TARGET if draft == "same-draft" else WEAK_DRAFT,
                                  keep_drafting=draft == "weak-draft")
    config["target"].update(backend="transformers", passes=passes)
    with hetspec.launch(config) as engine:
        kernels = engine.info["target"]["kernels"]
        assert "static KV cache, windows padded to 1, 2, 4, 8" in kernels
        assert ("recordings shared by every cache, as passes run eagerly (no CUDA)" in kernels) == (passes == "captured")
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


def test_every_buffer_and_cuda_call_of_a_captured_model_names_its_device():
    """cuda:N: a captured model's buffers are made on its configured device object, and every
    stream, wait and synchronisation it asks of CUDA names that device (CUDA's current device
    is cuda:0 unless set: its graphs would record nothing); checked on the CPU by the tensors
    the model holds and by its source's torch.cuda calls. The target sets the current device first."""
    import inspect
    import re

    from hetspec.workers.target import captured, transformers_target

    model = CapturedKVModel(load_reference("random:seed=3"), "cpu", 64, 5, caches=2)
    model.forward(list(range(10)), 0)
    layers = model.cache.layers
    held = [model._staged, *[t for pair in model.storage for t in pair], *[layer.keys for layer in layers],
            *[layer.cumulative_length for layer in layers]]
    assert all(t.device == model.device for t in held)
    calls = re.findall(r"torch\.cuda\.(\w+)\(([^)]*)\)", inspect.getsource(captured))
    named = [args for name, args in calls if name in ("Stream", "current_stream", "synchronize")]
    assert len(named) >= 4 and all("self.device" in args for args in named)
    assert "torch.cuda.set_device(torch.device(device))" in inspect.getsource(transformers_target.TransformersTarget)
