"""The native GGUF target (workers/target/native_target.py): a token's logits are the same
bits in any window and any prompt chunking, on random files of every block type it reads
and on both shipped files; and through the engine, greedy output in every mode is the
target alone's, and sampling keeps its distribution."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hetspec.core.pinning import pin
from hetspec.models import resolve_model
from hetspec.workers.common.native_model import Unsupported, lazy_zeros
from hetspec.workers.common.thread_pinning import CoreLoan
from hetspec.workers.target.native_target import NativeTarget
from tests.test_llama_target import (
    _engine_config,
    assert_batch_invariant,
    assert_sampling_follows,
    assert_speculation_is_the_target_alone,
    quantize,
    tensor_types,
    write_random_llama,
)

from helpers import FULL, draws, full_only, isa_params

# llama.cpp's file types the native target reads exactly, and the tensor types each brings
FTYPES = {"MOSTLY_Q4_0": {"Q4_0"}, "MOSTLY_Q4_1": {"Q4_1"}, "MOSTLY_Q8_0": {"Q8_0"},
          "MOSTLY_Q4_K_M": {"Q4_K", "Q6_K"}, "MOSTLY_Q5_K_M": {"Q5_K", "Q6_K"}}


@pytest.fixture(scope="module")
def random_f32(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "random-f32.gguf")
    write_random_llama(path, resolve_model("builtin:smollm2").file)
    return path


@pytest.fixture(params=isa_params())
def isa(request, monkeypatch):
    """The kernels built for this CPU, then for AVX2 alone (HETSPEC_ISA): an AVX-512 machine
    checks both instruction sets' products and row tiles."""
    monkeypatch.setenv("HETSPEC_ISA", request.param)
    return request.param


@pytest.mark.parametrize("ftype", full_only(*FTYPES, keep=["MOSTLY_Q8_0", "MOSTLY_Q4_K_M", "MOSTLY_Q5_K_M"]))
def test_every_block_type_is_batch_invariant(random_f32, tmp_path, ftype, isa):
    path = quantize(random_f32, str(tmp_path / f"{ftype}.gguf"), ftype)
    assert FTYPES[ftype] <= tensor_types(path)
    assert_batch_invariant(path, NativeTarget)


def assert_a_batch_gives_each_request_its_own_bits(path: str) -> None:
    """Several requests' windows in one pass, each in its own cache: every logit the bits
    of the same window run alone, through rollbacks, windows of 1 to 9 tokens, and
    prompts that spill over one pass into the next."""
    batched, alone = (NativeTarget(path, n_ctx=160, caches=4, threads=1) for _ in range(2))
    try:
        rng = np.random.default_rng(5)
        draw = lambda n: [int(t) for t in rng.integers(10, min(batched.n_vocab, 5000), n)]
        # rounds of (cache, tokens, keep, rows); each round one batch
        rounds = [[(0, draw(40), 0, 1), (1, draw(30), 0, 30), (2, draw(3), 0, 2)],
                  [(0, draw(1), 40, 1), (1, draw(5), 30, 5), (2, draw(9), 3, 9), (3, draw(12), 0, 1)],
                  [(3, draw(4), 10, 4), (1, draw(2), 33, 2), (0, draw(8), 41, 8)]]
        for windows in rounds:
            got = batched.forward_batch(windows)
            for (cache, tokens, keep, rows), logits in zip(windows, got):
                want = alone.forward(cache, tokens, keep, rows)
                assert logits.shape == want.shape and np.array_equal(logits.view(np.uint32), want.view(np.uint32)), \
                    (cache, len(tokens), keep)
        assert batched.lengths == alone.lengths == [49, 35, 12, 14]
        with pytest.raises(ValueError, match="each cache once"):
            batched.forward_batch([(0, [5], 49, 1), (0, [6], 50, 1)])
    finally:
        batched.close()
        alone.close()


def test_the_kernels_line_names_the_instruction_set(random_f32, tmp_path, isa, monkeypatch):
    """What a user on AVX2 sees at start-up: which products they got; a HETSPEC_ISA the build
    does not know is named, not guessed at."""
    from hetspec.benchmarks.bench.machine import cpu_isa
    from hetspec.workers.common.native_model import NativeModel
    from hetspec.workers.kernels.build import KernelUnavailable

    path = quantize(random_f32, str(tmp_path / "q8.gguf"), "MOSTLY_Q8_0")
    target, draft = NativeTarget(path, n_ctx=64, caches=1, threads=1), NativeModel(path, 64)
    try:
        assert target.isa == ("AVX2" if isa == "avx2" else cpu_isa())
        assert draft.description.startswith(f"native ({target.isa}), ") and "AVX" not in target.description
    finally:
        target.close()
        draft.close()
    monkeypatch.setenv("HETSPEC_ISA", "avx1024")
    with pytest.raises(KernelUnavailable, match="HETSPEC_ISA='avx1024' is not one of native, avx2"):
        NativeTarget(path, n_ctx=64, caches=1, threads=1)


def test_a_batch_gives_each_request_its_own_bits(random_f32, tmp_path, isa):
    assert_a_batch_gives_each_request_its_own_bits(quantize(random_f32, str(tmp_path / "q4km.gguf"), "MOSTLY_Q4_K_M"))


def huge_kb(array: np.ndarray) -> int:
    """AnonHugePages of the mappings that hold `array`, in kB (/proc/self/smaps)."""
    start, end, inside, total = array.ctypes.data, array.ctypes.data + array.nbytes, False, 0
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low < end and start < high
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's smaps")
def test_a_kv_cache_takes_small_pages_as_it_is_filled():
    """A request's first pass writes the start of each layer's region: in huge pages
    (np.zeros's, where the kernel grants them), each write would take and clear 2 MB."""
    cache = lazy_zeros((30, 3, 4096, 64), np.float16)   # a 4K-token cache: 512 kB a layer and head
    assert cache.shape == (30, 3, 4096, 64) and cache.dtype == np.float16 and cache.flags.writeable
    assert not cache.any()
    cache[:, :, :64] = 1.0                              # a 64-token prompt chunk in every region
    assert huge_kb(cache) == 0
    assert cache[:, :, :64].all() and not cache[:, :, 64:].any()


def assert_threads_change_no_bit(path: str) -> None:
    """A prompt and a window on 1, 2 and 3 threads (the target alone on borrowed cores):
    the products' rows are split among the threads, each computed as on one."""
    model = NativeTarget(path, n_ctx=128, caches=1, threads=1)
    try:
        tokens = [int(t) for t in np.random.default_rng(2).integers(10, min(model.n_vocab, 5000), 48)]
        runs = []
        for threads in (1, 2, 3, 1):
            model.set_threads(threads)
            assert model.threads == threads
            runs.append(np.concatenate([model.forward(0, tokens[:40], 0, 40), model.forward(0, tokens[40:], 40, 8),
                                        model.forward(0, tokens[47:], 47, 1)]).view(np.uint32))
        assert all(np.array_equal(run, runs[0]) for run in runs[1:])
    finally:
        model.close()


def test_threads_change_no_bit(random_f32, tmp_path, isa):
    assert_threads_change_no_bit(quantize(random_f32, str(tmp_path / "q4_k_m.gguf"), "MOSTLY_Q4_K_M"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_borrowed_core_gets_a_thread_of_its_own(random_f32, tmp_path):
    """Widened as the target is when it runs alone (CoreLoan), its pool's thread is pinned
    to the lent core and the caller's to the first; narrowed, both go back."""
    before = sorted(os.sched_getaffinity(0))
    cores = before[:2]
    model = NativeTarget(quantize(random_f32, str(tmp_path / "q8.gguf"), "MOSTLY_Q8_0"), n_ctx=64, caches=1, threads=1)
    loan = CoreLoan(cores[:1], cores[1:], model.set_threads, 1, model.thread_ids)
    try:
        loan.hold(True)
        [tid] = model.thread_ids()
        assert os.sched_getaffinity(0) == {cores[0]} and os.sched_getaffinity(tid) == {cores[1]}
        model.forward(0, [5, 6, 7], 0, 1)
        loan.hold(False)
        assert model.threads == 1 and model.thread_ids() == []
        assert os.sched_getaffinity(0) == os.sched_getaffinity(tid) == {cores[0]}
    finally:
        loan.hold(False)
        model.close()
        pin(before)


@pytest.fixture(scope="module")
def random_bf16(random_f32, tmp_path_factory):
    return quantize(random_f32, str(tmp_path_factory.mktemp("bf16") / "bf16.gguf"), "MOSTLY_BF16")


def test_bfloat16_weights_are_refused_not_rounded(random_bf16):
    """The float kernels read F16 and F32 (test_native_archs.py); bfloat16 they refuse."""
    with pytest.raises(Unsupported, match="BF16, which hetspec's kernels cannot hold exactly"):
        NativeTarget(random_bf16, n_ctx=64, caches=1, threads=1)


def test_auto_picks_native_only_for_a_gguf_file_in_float32_on_the_cpu():
    import torch

    from hetspec.ipc.specs import TargetSpec
    from hetspec.workers.target.worker import resolve_backend

    def spec(model: str, **kw) -> TargetSpec:
        return TargetSpec(**{"model": resolve_model(model), "dtype": "float32", "device": "cpu", "cores": [0],
                             "threads": 1, "backend": "auto", **kw})

    assert resolve_backend(spec("builtin:smollm2")) == "native"
    assert resolve_backend(spec("builtin:smollm2", device="auto")) == ("transformers" if torch.cuda.is_available() else "native")
    assert resolve_backend(spec("builtin:smollm2", dtype="bfloat16")) == "transformers"
    assert resolve_backend(spec("random:seed=0")) == "transformers"
    assert resolve_backend(spec("builtin:smollm2", backend="llama.cpp")) == "llama.cpp"


def test_auto_runs_a_file_the_native_target_refuses_through_llama_cpp(random_f32, tmp_path):
    """Backend "auto" on a Q3_K_M file, a block type the native kernels do not read: the
    llama.cpp target runs it, exact, and says why; never the float32 transformers model."""
    import hetspec

    path = quantize(random_f32, str(tmp_path / "q3_k_m.gguf"), "MOSTLY_Q3_K_M")
    assert "Q3_K" in tensor_types(path)
    with hetspec.launch(_engine_config(path, path, backend="auto")) as engine:
        target = engine.get_info()["target"]
        assert target["backend"] == "llama.cpp"
        assert "backend auto: no native target" in target["kernels"] and "Q3_K" in target["kernels"]
        alone = engine.generate("Once upon a time", max_new_tokens=24, mode="target")
        assert engine.generate("Once upon a time", max_new_tokens=24, mode="duodec").token_ids == alone.token_ids


@FULL
def test_auto_runs_a_bfloat16_file_in_float32(random_f32, random_bf16):
    """A bfloat16 file: the native kernels refuse it, and llama.cpp does where its float
    products are not batch-invariant (llamafile's sgemm); the transformers target then runs
    the file's weights in float32, and says why."""
    import hetspec
    from hetspec.workers.target.llama_target import LLAMAFILE

    with hetspec.launch(_engine_config(random_bf16, random_f32, backend="auto")) as engine:
        target = engine.get_info()["target"]
        assert target["backend"] == ("transformers" if LLAMAFILE else "llama.cpp")
        assert "backend auto: no native target" in target["kernels"] and "BF16" in target["kernels"]
        alone = engine.generate("Once upon a time", max_new_tokens=24, mode="target")
        assert engine.generate("Once upon a time", max_new_tokens=24, mode="duodec").token_ids == alone.token_ids


@pytest.mark.integration
@pytest.mark.parametrize("builtin", full_only("smollm2", "gemma3-270m", keep=["smollm2"]))
def test_the_shipped_files_are_batch_invariant(builtin):
    assert_a_batch_gives_each_request_its_own_bits(resolve_model(f"builtin:{builtin}").file)
    assert_batch_invariant(resolve_model(f"builtin:{builtin}").file, NativeTarget)
    assert_threads_change_no_bit(resolve_model(f"builtin:{builtin}").file)


@pytest.fixture(scope="module")
def native_pair(random_f32, tmp_path_factory):
    """A native Q4_K_M target with, as its draft, the Q8_0 file of the same weights;
    backend "auto" picks native for a GGUF file on the CPU (gemma3-smollm2 names it)."""
    folder = tmp_path_factory.mktemp("pair")
    target = quantize(random_f32, str(folder / "target.gguf"), "MOSTLY_Q4_K_M")
    draft = quantize(random_f32, str(folder / "draft.gguf"), "MOSTLY_Q8_0")
    import hetspec

    with hetspec.launch(_engine_config(target, draft, backend="auto")) as engine:
        assert engine.get_info()["target"]["backend"] == "native"
        yield engine, target


@pytest.mark.parametrize("mode,sequences", [("duodec", "dynamic"), ("duodec", 2), ("sequential", None)])
def test_greedy_in_every_mode_is_the_target_alone(native_pair, mode, sequences):
    engine, _ = native_pair
    assert engine.get_info()["target"]["kernels"].startswith("native")
    for prompt in ["def fibonacci(n):\n    ", "Once upon a time", [5, 9, 200, 31]]:
        alone = engine.generate(prompt, max_new_tokens=40, mode="target")
        got = engine.generate(prompt, max_new_tokens=40, mode=mode, sequences=sequences, speculation="always")
        assert got.token_ids == alone.token_ids
        assert got.stats["spec_rounds"] > 0


def test_unseeded_sampling_keeps_the_targets_distribution(native_pair):
    """Speculative sampling with top-k 4: the law of each of the first three tokens."""
    engine, target = native_pair
    assert_sampling_follows(engine, NativeTarget, target, draws(600), "duodec", seeded=False)


@pytest.mark.integration
def test_the_shipped_gemma_pair_runs_the_native_target_across_vocabularies():
    """gemma3-smollm2 as shipped: the native Gemma 3 target, SmolLM2 drafting in its own vocabulary."""
    import hetspec

    with hetspec.launch("gemma3-smollm2") as engine:
        info = engine.get_info()
        assert info["target"]["kernels"].startswith("native") and info["vocabulary"]["shared"] is False
        assert_speculation_is_the_target_alone(engine)
