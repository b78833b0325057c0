"""The native kernels on every architecture they run (native_weights.py, ARCHITECTURES): random
files of each, quantized by llama.cpp to the weight types real files use, are batch-
invariant bit for bit in the native target, and follow llama.cpp's logits on the same file."""
from __future__ import annotations

import numpy as np
import pytest

from hetspec.models import resolve_model
from hetspec.workers.common import file_embedding, native_model
from hetspec.workers.target import llama_target
from hetspec.workers.target.llama_target import LlamaTarget
from hetspec.workers.target.native_target import NativeTarget
from tests.test_llama_target import assert_batch_invariant, quantize, tensor_types, write_random_llama

from helpers import FULL

ARCHS = ("llama", "llama3", "qwen2", "qwen3")
# (architecture, llama.cpp file type, the tensor types it must bring): every architecture in
# the K-quant mix that Qwen2.5 and Llama 3 files ship in; the other block types once each
CASES = [*((arch, "MOSTLY_Q4_K_M", {"Q4_K", "Q6_K"}) for arch in ARCHS),
         ("qwen2", "MOSTLY_Q5_0", {"Q5_0"}), ("llama", "MOSTLY_Q5_1", {"Q5_1"}), ("qwen3", "MOSTLY_Q8_0", {"Q8_0"}),
         ("llama3", "MOSTLY_F16", {"F16"}), ("qwen2", "ALL_F32", {"F32"})]


@pytest.fixture(scope="module")
def random_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archs")
    tokenizer = resolve_model("builtin:smollm2").file
    paths = {}
    for arch in ARCHS:
        paths[arch] = str(folder / f"{arch}-f32.gguf")
        write_random_llama(paths[arch], tokenizer, seed=3, arch=arch)
    return paths


# CI's short form: the K-quant mix on three architectures, Q5_0 on qwen2 (Qwen2.5-Coder-0.5B's)
SHORT = {("llama", "MOSTLY_Q4_K_M"), ("llama3", "MOSTLY_Q4_K_M"), ("qwen3", "MOSTLY_Q4_K_M"), ("qwen2", "MOSTLY_Q5_0")}


@pytest.mark.parametrize("arch,ftype,types", [pytest.param(a, f, t, id=f"{a}-{f}", marks=() if (a, f) in SHORT else FULL)
                                              for a, f, t in CASES])
def test_every_architecture_is_batch_invariant(random_files, tmp_path, arch, ftype, types):
    source = random_files[arch]
    path = source if ftype == "ALL_F32" else quantize(source, str(tmp_path / f"{arch}-{ftype}.gguf"), ftype)
    assert types <= tensor_types(path)
    assert_batch_invariant(path, NativeTarget)


@pytest.mark.parametrize("arch,ftype", [*((arch, "MOSTLY_Q8_0") for arch in ARCHS), ("llama3", "MOSTLY_F16")])
def test_every_architecture_follows_llama_cpps_logits(random_files, tmp_path, monkeypatch, arch, ftype):
    """Along llama.cpp's own greedy path, the native target picks llama.cpp's token nearly
    everywhere and its logits stay close: each architecture's differences (rope pairs or
    halves, rope_freqs, biases, query and key norms) are computed as llama.cpp computes them,
    and so are float matrices. A mistake in any of them (tried: rope without rope_freqs)
    drops agreement far below."""
    path = quantize(random_files[arch], str(tmp_path / f"{arch}-{ftype}.gguf"), ftype)
    # a float file's products in llama.cpp may differ with the batch (llamafile's sgemm):
    # LlamaTarget refuses it as a target, but it is still llama.cpp's arithmetic to follow
    monkeypatch.setattr(llama_target, "LLAMAFILE", False)
    theirs = LlamaTarget(path, n_ctx=128, caches=1, threads=1)
    try:
        tokens = [int(t) for t in np.random.default_rng(4).integers(10, 5000, 8)]
        for _ in range(40):
            tokens.append(int(theirs.forward(0, tokens, 0, 1)[0].argmax()))
        want = theirs.forward(0, tokens, 0, len(tokens))
    finally:
        theirs.close()
    ours = NativeTarget(path, n_ctx=128, caches=1, threads=1)
    try:
        got = ours.forward(0, tokens, 0, len(tokens))
    finally:
        ours.close()
    agree = (got.argmax(axis=1) == want.argmax(axis=1)).mean()
    spread = np.abs(got - want).max(axis=1)
    assert agree >= 0.9 and np.median(spread) < 0.1 * want.std(), (agree, np.median(spread), want.std())


def test_token_embeddings_read_from_the_files_blocks_change_no_bit(tmp_path, monkeypatch):
    """With an output layer of its own, the embedding table is read a row at a time from
    the file (file_embedding.FileEmbedding) instead of held converted: the same logits, bit for
    bit, in the target's windows and steps and in a draft holding K-quants exactly, and
    still batch-invariant. (A draft rounding K-quants to Q8_0 now reads its embeddings
    unrounded.)"""
    source = str(tmp_path / "qwen2-output-f32.gguf")
    write_random_llama(source, resolve_model("builtin:smollm2").file, seed=5, arch="qwen2", output=True)
    path = quantize(source, str(tmp_path / "qwen2-output-q4_k_m.gguf"), "MOSTLY_Q4_K_M")
    tokens = [int(t) for t in np.random.default_rng(6).integers(10, 5000, 24)]

    def run():
        target = NativeTarget(path, n_ctx=64, caches=1, threads=1)
        draft = native_model.NativeModel(path, n_ctx=64, exact_kquants=True)   # (else K-quants round to Q8_0)
        try:
            return (target.description, target.forward(0, tokens, 0, 8).copy(), target.forward(0, tokens[:3], 0, 1).copy(),
                    draft.description, draft.forward(tokens, 0).copy())
        finally:
            target.close()
            draft.close()

    read = run()
    assert "token embeddings read from the file's blocks" in read[0] and "from the file's blocks" in read[3]
    monkeypatch.setattr(file_embedding.FileEmbedding, "of", classmethod(lambda cls, tensors, rows: None))
    held = run()
    assert "from the file's blocks" not in held[0]
    for a, b in zip(read[1:], held[1:]):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
    monkeypatch.undo()
    assert_batch_invariant(path, NativeTarget)


@pytest.mark.parametrize("ftype", ["MOSTLY_Q4_K_M", "MOSTLY_Q5_0"])
def test_a_draft_holding_its_blocks_exactly_reads_a_long_prompt_as_token_by_token(random_files, tmp_path, ftype):
    """A long prompt goes through the window products (WINDOW_FILL), whose AVX-512 build reads
    neither the K-quants' own layouts nor Q5_0: such matrices are taken token by token there.
    The logits follow the one-token steps' on either instruction set (the window rounds its
    activations to 8 bits, the steps to 16), and are never NaN."""
    path = quantize(random_files["qwen2"], str(tmp_path / f"qwen2-{ftype}.gguf"), ftype)
    tokens = [int(t) for t in np.random.default_rng(7).integers(10, 5000, 2 * native_model.WINDOW_FILL)]
    fed, stepped = (native_model.NativeModel(path, n_ctx=64, exact_kquants=True) for _ in range(2))
    try:
        long = fed.forward(tokens, 0).copy()
        for pos, token in enumerate(tokens):
            short = stepped.forward([token], pos)
        assert np.isfinite(long).all()
        assert np.corrcoef(long, short)[0, 1] > 0.999
    finally:
        fed.close()
        stepped.close()
