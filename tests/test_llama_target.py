"""The llama.cpp target is batch-invariant: each row of a window (1-40 tokens, any
chunking of the prompt) is bit for bit the logits of a one-token pass at that
position, for every weight type of the shipped files and of random files written here."""
from __future__ import annotations

import ctypes
import functools
import os

import gguf
import llama_cpp
import numpy as np
import pytest

from hetspec.models import resolve_model
from hetspec.workers.target.llama_target import LLAMAFILE, MAX_PASS, LlamaTarget

from helpers import FULL, draws, full_only

PROMPT, STEPS = 70, 40       # a prompt longer than one pass, then a greedy continuation
# llama.cpp's file types, and the tensor types each must bring (K-quant mixes bring two)
FTYPES = {"ALL_F32": {"F32"}, "MOSTLY_F16": {"F16"}, "MOSTLY_Q4_0": {"Q4_0"}, "MOSTLY_Q4_1": {"Q4_1"},
          "MOSTLY_Q8_0": {"Q8_0"}, "MOSTLY_Q4_K_M": {"Q4_K", "Q6_K"}, "MOSTLY_Q5_K_M": {"Q5_K", "Q6_K"},
          "MOSTLY_Q6_K": {"Q6_K"}}


@functools.cache
def tokenizer_fields(path: str) -> dict:
    """A GGUF file's tokenizer fields, key: (contents, type, sub-type), read once per file
    (gguf's reader takes seconds over a 49,152-token vocabulary)."""
    fields = gguf.GGUFReader(path).fields.items()
    return {key: (field.contents(), field.types[0], field.types[1] if len(field.types) > 1 else None)
            for key, field in fields if key.startswith("tokenizer.")}


def write_random_llama(path: str, tokenizer_from: str, seed: int = 0, arch: str = "llama",
                       output: bool = False) -> None:
    """A 2-layer GGUF file (width 256, as K-quant blocks need) with random float32 weights
    and the tokenizer of `tokenizer_from`. arch: "llama", "llama3" (a llama file with
    Llama 3's rope_freqs), "qwen2" (query, key and value biases) or "qwen3" (query and key
    norms, heads of 64 that do not divide the width: 8 heads, 512 query values). output:
    an output layer of its own (as the Qwen2.5-Coder files have), else the embedding's."""
    fields = tokenizer_fields(tokenizer_from)
    n_vocab, width, ff, kv_heads = len(fields["tokenizer.ggml.tokens"][0]), 256, 512, 2
    heads, head_dim = (8, 64) if arch == "qwen3" else (4, 64)
    writer = gguf.GGUFWriter(path, "llama" if arch == "llama3" else arch)
    _write_header(writer, fields, width, ff, heads, kv_heads, head_dim)
    rng = np.random.default_rng(seed)

    def weight(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, width))
    writer.add_tensor("output_norm.weight", np.ones(width, np.float32))
    if output:
        writer.add_tensor("output.weight", weight(n_vocab, width))
    if arch == "llama3":                  # divisors of the rope's angles, from 1 to 8 (as Llama 3's)
        writer.add_tensor("rope_freqs.weight", np.geomspace(1.0, 8.0, head_dim // 2).astype(np.float32))
    for i in range(2):
        _write_layer(writer, i, weight, arch, width, ff, heads * head_dim, kv_heads * head_dim, head_dim)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_header(writer, fields: dict, width: int, ff: int, heads: int, kv_heads: int, head_dim: int) -> None:
    writer.add_context_length(2048)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(ff)
    writer.add_block_count(2)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, (contents, kind, sub) in fields.items():
        writer.add_key_value(key, contents, kind, sub_type=sub)


def _write_layer(writer, i: int, weight, arch: str, width: int, ff: int, q: int, kv: int, head_dim: int) -> None:
    """Layer i's tensors, drawn from `weight` in a fixed order (the file is the same for a seed)."""
    for name, shape in (("attn_q", (q, width)), ("attn_k", (kv, width)), ("attn_v", (kv, width)),
                        ("attn_output", (width, q)), ("ffn_gate", (ff, width)), ("ffn_up", (ff, width)),
                        ("ffn_down", (width, ff))):
        writer.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
    writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, np.float32))
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(width, np.float32))
    if arch == "qwen2":
        for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            writer.add_tensor(f"blk.{i}.{name}.bias", weight(n, scale=0.5))
    if arch == "qwen3":
        for name in ("attn_q_norm", "attn_k_norm"):
            writer.add_tensor(f"blk.{i}.{name}.weight", 1.0 + weight(head_dim, scale=0.2))


def quantize(source: str, target: str, ftype: str) -> str:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + ftype)
    if llama_cpp.llama_model_quantize(os.fsencode(source), os.fsencode(target), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not write {ftype}")
    return target


def tensor_types(path: str) -> set[str]:
    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if t.name.endswith(".weight")
            and "norm" not in t.name}


def one_token_passes(model: LlamaTarget, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """The reference, in cache 0: every position's logits, one token a pass, along the greedy path."""
    tokens, rows = list(prompt), []
    for pos in range(PROMPT + STEPS):
        rows.append(model.forward(0, tokens[pos:pos + 1], pos, 1)[0])
        if pos + 1 >= len(tokens):
            tokens.append(int(rows[-1].argmax()))
    return tokens, np.stack(rows)


def assert_batch_invariant(path: str, target=LlamaTarget) -> None:
    """target: LlamaTarget, or any class with its constructor and forward (NativeTarget)."""
    model = target(path, n_ctx=256, caches=2, threads=1)
    try:
        prompt = [int(t) for t in np.random.default_rng(1).integers(10, min(model.n_vocab, 5000), PROMPT)]
        tokens, want = one_token_passes(model, prompt)
        bits = want.view(np.uint32)
        # the whole sequence at once (MAX_PASS tokens a pass), every row, in cache 1
        assert np.array_equal(model.forward(1, tokens[:PROMPT + STEPS], 0, PROMPT + STEPS).view(np.uint32), bits)
        for w in range(1, STEPS + 1):          # every window length after the prompt
            got = model.forward(1, tokens[PROMPT:PROMPT + w], PROMPT, w)
            assert np.array_equal(got.view(np.uint32), bits[PROMPT:PROMPT + w]), f"window of {w} differs"
        for chunk in (1, 7, MAX_PASS - 1):     # the prompt in other chunks, then one window
            for start in range(0, PROMPT, chunk):
                model.forward(1, tokens[start:min(start + chunk, PROMPT)], start, 1)
            got = model.forward(1, tokens[PROMPT:PROMPT + 12], PROMPT, 12)
            assert np.array_equal(got.view(np.uint32), bits[PROMPT:PROMPT + 12]), f"prompt in chunks of {chunk}"
    finally:
        model.close()


@pytest.fixture(scope="module")
def random_f32(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "random-f32.gguf")
    write_random_llama(path, resolve_model("builtin:smollm2").file)
    return path


@pytest.fixture(scope="module")
def random_q8(random_f32, tmp_path_factory):
    return quantize(random_f32, str(tmp_path_factory.mktemp("q8") / "random-q8_0.gguf"), "MOSTLY_Q8_0")


@pytest.mark.parametrize("ftype", full_only(*FTYPES, keep=["MOSTLY_F16", "MOSTLY_Q4_K_M"]))
def test_every_weight_type_is_batch_invariant(random_f32, tmp_path, ftype):
    path = random_f32 if ftype == "ALL_F32" else quantize(random_f32, str(tmp_path / f"{ftype}.gguf"), ftype)
    assert FTYPES[ftype] <= tensor_types(path)
    if LLAMAFILE and ftype in ("ALL_F32", "MOSTLY_F16"):    # llamafile's sgemm multiplies float batches
        with pytest.raises(ValueError, match="float weights .* does not compute batch-invariantly"):
            LlamaTarget(path, n_ctx=64, caches=1, threads=1)
        return
    assert_batch_invariant(path)


@pytest.mark.integration
@pytest.mark.parametrize("builtin", full_only("smollm2", "gemma3-270m", keep=["smollm2"]))
def test_the_shipped_files_are_batch_invariant(builtin):
    assert_batch_invariant(resolve_model(f"builtin:{builtin}").file)


@pytest.mark.integration
@pytest.mark.parametrize("builtin", full_only("smollm2", "gemma3-270m", keep=["smollm2"]))
def test_the_window_output_layer_computes_llama_cpps_logits(builtin):
    """Both shipped files keep their output layer in Q8_0: hetspec's kernel computes it for
    a window at once, with llama.cpp's arithmetic, so the logits are llama.cpp's own."""
    path = resolve_model(f"builtin:{builtin}").file
    ours, theirs = LlamaTarget(path, 256, 1, 1), LlamaTarget(path, 256, 1, 1, own_output_layer=False)
    try:
        assert ours.head is not None and theirs.head is None
        tokens = [int(t) for t in np.random.default_rng(2).integers(10, 5000, 45)]
        for start, n in ((0, 40), (40, 1), (41, 4)):      # a prompt over two passes, one token, a window
            got, want = (m.forward(0, tokens[start:start + n], start, n) for m in (ours, theirs))
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    finally:
        ours.close()
        theirs.close()


def test_a_window_that_does_not_follow_the_cache_is_refused(random_q8):
    model = LlamaTarget(random_q8, n_ctx=64, caches=1, threads=1)
    try:
        model.forward(0, [1, 2, 3], 0, 1)
        with pytest.raises(ValueError, match="do not follow the 3 cached"):
            model.forward(0, [4], 5, 1)
        with pytest.raises(ValueError, match="cache 1 is not one of the 1"):
            model.forward(1, [4], 0, 1)
        model.forget(0)
        assert model.lengths == [0]
    finally:
        model.close()


# ---- through the engine ------------------------------------------------------------------

def _engine_config(target: str, draft: str, backend: str = "llama.cpp") -> dict:
    return {"target": {"backend": backend, "model": target},
            "draft": {"backend": "llama.cpp", "model": draft, "weights": "as-is"},
            "decoding": {"gamma": 4, "speculation": "always"}, "server": {"max_context": 512}}


@pytest.fixture(scope="module")
def random_pair(random_f32, random_q8, tmp_path_factory):
    """A Q4_K_M target and, as its draft, the Q8_0 file of the same weights: they agree
    often, not always, so windows are both accepted and rejected."""
    target = quantize(random_f32, str(tmp_path_factory.mktemp("q4km") / "target.gguf"), "MOSTLY_Q4_K_M")
    import hetspec

    with hetspec.launch(_engine_config(target, random_q8)) as engine:
        yield engine, target


@pytest.mark.parametrize("mode,sequences", [("duodec", "dynamic"), ("duodec", 2), ("sequential", None)])
def test_greedy_in_every_mode_is_the_target_alone(random_pair, mode, sequences):
    engine, _ = random_pair
    for prompt in ["def fibonacci(n):\n    ", "Once upon a time", [5, 9, 200, 31]]:
        alone = engine.generate(prompt, max_new_tokens=40, mode="target")
        got = engine.generate(prompt, max_new_tokens=40, mode=mode, sequences=sequences)
        assert got.token_ids == alone.token_ids
        assert got.stats["spec_rounds"] > 0


def _joint(model: LlamaTarget, prompt: list[int], temperature: float, top_k: int) -> dict:
    """P(x1, x2, x3 | prompt) under the target's own sampling, by enumerating the top-k supports."""
    from hetspec.core.sampling import probabilities

    def law(ids):
        logits = model.forward(0, ids, 0, 1)
        return probabilities(logits, temperature, top_k, 1.0)[0].astype(np.float64)

    joint, p1 = {}, law(prompt)
    for a in np.flatnonzero(p1):
        p2 = law([*prompt, a])
        for b in np.flatnonzero(p2):
            p3 = law([*prompt, a, b])
            for c in np.flatnonzero(p3):
                joint[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    return joint


def assert_positions_follow(exact: dict, counts: dict, n: int) -> None:
    """Each of the three positions' sampled law (counts of n draws) against the exact joint's
    marginal: total variation beyond every one of 2,000 samples of n exact draws, with room."""
    rng = np.random.default_rng(0)
    for axis in range(3):
        want, got = {}, {}
        for key, p in exact.items():
            want[key[axis]] = want.get(key[axis], 0) + p
        for key, c in counts.items():
            got[key[axis]] = got.get(key[axis], 0) + c / n
        law = np.array(list(want.values()))
        tv = 0.5 * sum(abs(want[k] - got.get(k, 0)) for k in want)
        noise = 0.5 * np.abs(rng.multinomial(n, law, size=2000) / n - law).sum(axis=1)
        assert tv < 1.2 * noise.max(), (axis, tv, noise.max())


@pytest.mark.parametrize("mode,seeded", [pytest.param("duodec", True, marks=FULL), pytest.param("sequential", True, marks=FULL),
                                         ("duodec", False)])   # seeded: the target alone's tokens, token for token
def test_sampling_keeps_the_targets_distribution(random_pair, mode, seeded):
    """Seeded (keyed draws) and unseeded (speculative sampling), top-k 4 so that three
    positions have at most 64 outcomes; the law of the first pair and of each position."""
    engine, target = random_pair
    drafted, accepted = assert_sampling_follows(engine, LlamaTarget, target, draws(1000), mode, seeded)
    assert drafted > 0 and 0 < accepted < drafted


def assert_sampling_follows(engine, target_class, path: str, n: int, mode: str, seeded: bool) -> tuple[int, int]:
    """n draws of the first three tokens (top-k 4) follow the target's own law, read from
    target_class(path); the drafted and accepted tokens of the draws."""
    prompt = [5, 9, 200, 31]
    model = target_class(path, n_ctx=64, caches=1, threads=1)
    try:
        exact = _joint(model, prompt, 1.0, 4)
    finally:
        model.close()
    counts: dict = {}
    drafted = accepted = 0
    for seed in range(n):
        r = engine.generate(prompt, max_new_tokens=5, temperature=1.0, top_k=4, seed=seed if seeded else None,
                            mode=mode)
        key = tuple(r.token_ids[:3])
        assert key in exact, f"{key} is outside the target's top-4 supports"
        counts[key] = counts.get(key, 0) + 1
        drafted, accepted = drafted + r.stats["drafted"], accepted + r.stats["accepted"]
    assert_positions_follow(exact, counts, n)
    return drafted, accepted


@pytest.mark.integration
@FULL
def test_gemma_with_a_smollm2_draft_across_vocabularies_is_the_target_alone():
    """The shipped gemma3-smollm2 pair with a llama.cpp target (it ships with the native one:
    tests/test_native_target.py), a native draft of another vocabulary."""
    import tomllib
    from importlib import resources

    import hetspec

    config = tomllib.loads(resources.files("hetspec.configs").joinpath("gemma3-smollm2.toml").read_text())
    config["target"]["backend"] = "llama.cpp"
    with hetspec.launch(config) as engine:
        assert "llama.cpp" in engine.get_info()["target"]["kernels"]
        assert_speculation_is_the_target_alone(engine)


def assert_speculation_is_the_target_alone(engine) -> None:
    """Greedy duodec and sequential output, speculating every round, equals the target alone's."""
    for prompt in ["def quicksort(arr):\n    ", "The history of the Roman Empire began"]:
        alone = engine.generate(prompt, max_new_tokens=32, mode="target")
        for mode in ("duodec", "sequential"):
            got = engine.generate(prompt, max_new_tokens=32, mode=mode, speculation="always")
            assert got.token_ids == alone.token_ids, mode
            assert got.stats["spec_rounds"] > 0


def test_the_target_alone_holds_the_drafts_cores_until_speculation_resumes(random_q8):
    """alone_borrows_draft_cores = true: a target-only request runs the target on every core
    of the engine, and the next speculative round gives the draft's core back."""
    import hetspec

    def cores_of(pid: int) -> set[int]:          # every thread's, the compute threads included
        return set().union(*(os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")))

    config = _engine_config(random_q8, random_q8)
    config["target"]["alone_borrows_draft_cores"] = True
    with hetspec.launch(config) as engine:
        info = engine.get_info()
        if set(info["draft"]["cores"]) <= set(info["target"]["cores"]):
            pytest.skip("the draft has no core of its own here")
        assert info["alone_borrows_draft_cores"] is True
        pid = info["target"]["pid"]
        alone = engine.generate("Once upon a time", max_new_tokens=16, mode="target")
        assert cores_of(pid) == set(info["draft"]["cores"]) | set(info["target"]["cores"])
        spec = engine.generate("Once upon a time", max_new_tokens=16, mode="duodec")
        assert cores_of(pid) == set(info["target"]["cores"])
        assert spec.token_ids == alone.token_ids
