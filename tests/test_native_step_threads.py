"""The native draft's one-token step on a small random GGUF file: its products split
among the pool's threads give the same bits at any thread count, and a step halted by
its flag (the scheduler's verdict, DraftLink.halt) stops at once and leaves nothing the
next step at its position depends on; the drafter's extension then ends without it.
Also the start-up choice of a thread count, and a prefill on borrowed cores."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hetspec.core.pinning import pin
from hetspec.core.sampling import GREEDY
from hetspec.ipc.messages import BranchPlan
from hetspec.models import resolve_model
from hetspec.workers.common.native_model import WINDOW_FILL, NativeModel
from hetspec.workers.common.thread_pinning import borrowed_cores
from hetspec.workers.draft import thread_choice
from hetspec.workers.draft.drafter import Drafter
from tests.test_llama_target import quantize, write_random_llama

TOKENS = [int(t) for t in np.random.default_rng(11).integers(10, 5000, 24)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A random llama file in float32 (the draft holds its matrices as Q8_0, its output
    layer read in a Q4_1 copy) and in Q4_0 (read as stored: AVX-512's tiles of 4 rows)."""
    folder = tmp_path_factory.mktemp("step")
    source = str(folder / "llama-f32.gguf")
    write_random_llama(source, resolve_model("builtin:smollm2").file, seed=8)
    return {"q8_0": source, "q4_0": quantize(source, str(folder / "llama-q4_0.gguf"), "MOSTLY_Q4_0")}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernels"))     # built once for the module


@pytest.fixture
def model(request, files, kernels):
    net = NativeModel(files[request.param], 128, kernels)
    yield net
    net.set_threads(1)          # the pool is the process's
    net.close()


def _steps(net: NativeModel) -> bytes:
    """Every step's logits along TOKENS, one token a step."""
    return b"".join(net.forward([token], pos).tobytes() for pos, token in enumerate(TOKENS))


@pytest.mark.parametrize("model", ["q8_0", "q4_0"], indirect=True)
def test_a_steps_logits_do_not_depend_on_the_thread_count(model):
    want = _steps(model)
    for threads in (2, 3, 1):
        assert model.set_threads(threads) == threads
        assert len(model.thread_ids()) == threads - 1
        assert _steps(model) == want, threads


@pytest.mark.parametrize("model", ["q8_0"], indirect=True)
def test_a_halted_step_returns_at_once_and_the_next_step_there_is_unchanged(model):
    for pos, token in enumerate(TOKENS[:8]):
        model.forward([token], pos)
    want = model.forward([TOKENS[8]], 8).copy()
    halt = np.ones(1, np.int32)
    assert model.forward([TOKENS[9]], 8, halt=halt) is None    # another token, halted before its first layer
    assert model.n_cached == 8
    halt[0] = 0
    assert np.array_equal(model.forward([TOKENS[8]], 8, halt=halt), want)   # a flag at 0 changes nothing
    assert np.array_equal(model.forward([TOKENS[8]], 8), want)


@pytest.mark.parametrize("model", ["q8_0"], indirect=True)
def test_a_halted_extension_ends_without_its_token(model):
    drafter = Drafter(model, 128)
    context = np.asarray(TOKENS[:10], np.int32)
    drafter.draft(context, 3, GREEDY, BranchPlan(1, 4, 0.8, extend_to=8))
    halt = np.zeros(1, np.int32)
    extension = drafter.extend(8, halt)
    token, _ = next(extension)                         # a step runs while the flag is down
    cached = drafter.n_cached
    halt[0] = 1
    assert next(extension, None) is None and drafter.n_cached == cached
    branch = drafter._likeliest[0]
    assert len(branch) == 4 and branch[-1] == token
    # the cache is as the drafter says: a fresh draft after the branch agrees with one from scratch
    after = np.concatenate([context, branch]).astype(np.int32)
    got = drafter.draft(after, 4, GREEDY).branches[0]
    drafter.n_cached = 0
    assert drafter.draft(after, 4, GREEDY).branches[0] == got


@pytest.mark.parametrize("model", ["q8_0"], indirect=True)
def test_the_start_up_measurement_keeps_one_of_the_counts_it_timed(model):
    assert thread_choice.candidates(1) == [1] and thread_choice.candidates(6) == [1, 2, 4, 6]
    assert thread_choice.candidates(8) == [1, 2, 4, 8]
    cores = sorted(os.sched_getaffinity(0))
    try:
        chosen, timed = thread_choice.fastest_threads(model, cores)
    finally:
        pin(cores)                                     # it pinned pytest's thread to the first
    assert timed == thread_choice.candidates(len(cores)) and chosen in timed and model.threads == chosen


@pytest.mark.parametrize("model", ["q8_0"], indirect=True)
def test_a_prefill_on_borrowed_cores_splits_the_native_products_there(model):
    """borrowed_cores widens the pool to the lent cores, a pool thread pinned to each,
    and narrows it back afterwards (the draft's prefill on the target's cores)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    own, lent = cores[:1], cores[1:2]
    try:
        with borrowed_cores(own, lent, model.set_threads, 1, model.thread_ids):
            assert model.threads == 2
            assert [os.sched_getaffinity(tid) for tid in model.thread_ids()] == [set(lent)]
            model.forward(TOKENS[:WINDOW_FILL + 2], 0)
        assert model.threads == 1
    finally:
        pin(cores)
