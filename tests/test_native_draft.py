"""The native draft (workers/kernels/native_model.c) with the real SmolLM2 and Gemma 3
GGUF files: it follows the float32 target's greedy path, fills its cache from a
long feed in windows, rewinds and takes the target's prompt cache like llama.cpp's
draft (Gemma's sliding-window layers past their window too), refuses what it cannot
run, and the draft worker then falls back to llama.cpp saying why."""
import gguf
import numpy as np
import pytest
import torch

import hetspec
from hetspec.ipc.specs import DraftSpec
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer
from hetspec.workers.common import native_model
from hetspec.workers.common.block_layouts import as_q8_0
from hetspec.workers.common.hf_loading import load_causal_lm
from hetspec.workers.common.kv_model import KVModel
from hetspec.workers.common.native_model import WINDOW_FILL, NativeModel, Unsupported
from hetspec.workers.draft.worker import DraftState
from hetspec.workers.kernels.gguf_tensors import GGUFTensor

pytestmark = pytest.mark.integration

CHAT = [{"role": "user", "content": "Explain in three sentences why the sky is blue, then give one example."}]
STEPS = 24


@pytest.fixture(scope="module")
def smollm2():
    return resolve_model("builtin:smollm2")


@pytest.fixture(scope="module")
def target_path(smollm2):
    """The float32 target's prompt, its greedy continuation, its logits along it and its prompt cache."""
    torch.set_num_threads(2)
    kv = KVModel(load_causal_lm(smollm2, "float32"))
    prompt = [int(t) for t in Tokenizer(smollm2).encode_chat(CHAT)]
    logits = [kv.forward(prompt, 0)[-1]]
    tokens = []
    for i in range(STEPS):
        tokens.append(int(logits[-1].argmax()))
        logits.append(kv.forward(tokens[-1:], len(prompt) + i)[-1])
    layers = list(kv.layer_kv(len(prompt) - 1))
    keys = np.stack([k.to(torch.float16).numpy() for k, _ in layers])
    values = np.stack([v.to(torch.float16).numpy() for _, v in layers])
    return prompt, tokens, torch.stack(logits).numpy(), keys, values


@pytest.fixture(scope="module")
def native(smollm2, tmp_path_factory):
    model = NativeModel(smollm2.file, 1024, str(tmp_path_factory.mktemp("cache")))
    yield model
    model.close()


def _stepped(model, tokens, pos=0):
    """Feed tokens a few at a time, each through the one-token step (not the window fill)."""
    for start in range(0, len(tokens), WINDOW_FILL - 1):
        logits = model.forward(tokens[start:start + WINDOW_FILL - 1], pos + start)
    return logits


def _path_logits(model, prompt, tokens, fill=False):
    """Logits along the target's path, the prompt stepped (or, with fill, in one feed)."""
    got = [(model.forward(prompt, 0) if fill else _stepped(model, prompt)).copy()]
    for i, token in enumerate(tokens):
        got.append(model.forward([token], len(prompt) + i).copy())
    return np.stack(got)


def test_the_native_draft_follows_the_targets_greedy_path(native, target_path):
    """Same weights, activations rounded to int16 per block: the draft picks
    the target's token at every step of this path, and its largest logits
    (those its output layer recomputes in Q8_0) stay within a small fraction
    of their spread of the target's."""
    prompt, tokens, want, _, _ = target_path
    got = _path_logits(native, prompt, tokens)
    assert [int(row.argmax()) for row in got[:-1]] == tokens
    top = np.argsort(-got, axis=1)[:, :4]
    near = np.take_along_axis(got, top, 1) - np.take_along_axis(want, top, 1)
    spread = want.std(axis=1, keepdims=True)
    assert np.abs(near).max() < 0.02 * spread.min()
    assert np.abs(near).mean() < 0.004 * spread.mean()


def test_the_output_layers_q4_1_copy_changes_no_greedy_choice(smollm2, native, target_path, tmp_path):
    """The Q4_1 copy of the output layer only picks which logits the Q8_0 rows
    recompute: the argmax and its logit are the full layer's, bit for bit; the
    other logits are the copy's, off by far more than rounding."""
    assert "Q4_1 copy" in native.description
    full = NativeModel(smollm2.file, 1024, str(tmp_path), fast_head=False)
    assert "Q4_1 copy" not in full.description
    prompt, tokens, _, _, _ = target_path
    fast, exact = _path_logits(native, prompt, tokens), _path_logits(full, prompt, tokens)
    best = exact.argmax(axis=1)
    assert np.array_equal(fast.argmax(axis=1), best)
    assert np.array_equal(fast[np.arange(len(best)), best], exact[np.arange(len(best)), best])
    assert np.abs(fast - exact).max() > 0.1
    full.close()


def test_a_long_feed_fills_the_cache_alike_however_it_is_split(native, target_path):
    """A feed of WINDOW_FILL tokens or more fills the cache through the window products,
    which compute a token the same whatever window it comes in: the prompt in one feed,
    or in two that overlap, leaves the same bits. It is still the float32 target's
    path, its largest logits further off than the stepped draft's where its activations
    are 8-bit (AVX-512 VNNI)."""
    prompt, tokens, want, _, _ = target_path
    whole = native.forward(prompt, 0).copy()
    split = len(prompt) // 2
    native.forward(prompt[:split + 1], 0)                     # its last token stepped...
    again = native.forward(prompt[split:], split)             # ...then filled again
    assert len(prompt) - split >= WINDOW_FILL and np.array_equal(whole, again)
    stepped = _stepped(native, prompt).copy()     # 8-bit window products round otherwise than a 16-bit step
    assert not np.array_equal(whole, stepped)
    got = _path_logits(native, prompt, tokens, fill=True)
    assert [int(row.argmax()) for row in got[:-1]] == tokens
    top = np.argsort(-got, axis=1)[:, :4]
    near = np.take_along_axis(got, top, 1) - np.take_along_axis(want, top, 1)
    assert np.abs(near).max() < 0.25 * want.std(axis=1).min()


def test_rewinding_recomputes_from_the_given_position(native, target_path):
    prompt, tokens, _, _, _ = target_path
    first = native.forward(prompt + tokens[:12], 0).copy()
    native.forward([5, 6, 7], len(prompt) + 2)                # a rejected branch
    again = native.forward(tokens[2:12], len(prompt) + 2)     # rewound: its positions are replaced
    assert np.array_equal(first, again)
    with pytest.raises(ValueError, match="only positions"):
        native.forward([1], len(prompt) + 20)
    with pytest.raises(ValueError, match="token ids must be in"):
        native.forward([native.n_vocab], 3)


def test_the_targets_prompt_cache_stands_in_for_the_drafts_prefill(native, target_path):
    """The target's float32 cache (as float16, transformers' rope order) gives
    the draft's own prefill's next-token logits to rounding."""
    prompt, _, want, keys, values = target_path
    assert native.kv_geometry() == [keys.shape[0], keys.shape[1], keys.shape[3], keys.shape[0]]
    native.import_kv(keys, values)
    handed_over = native.forward(prompt[-1:], len(prompt) - 1).copy()
    own = _stepped(native, prompt).copy()
    assert handed_over.argmax() == own.argmax() == want[0].argmax()
    assert np.abs(handed_over - own).max() < 0.02 * want[0].std()


def test_another_architecture_is_refused(tmp_path):
    path = str(tmp_path / "phi3.gguf")
    writer = gguf.GGUFWriter(path, "phi3")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(Unsupported, match="run llama, qwen2, qwen3, gemma3 files, not 'phi3'"):
        NativeModel(path, 256, str(tmp_path))


def test_without_a_compiler_the_worker_falls_back_to_llama_cpp(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    native_model._load_library.cache_clear()     # a native model loaded earlier in this process (test_batch's) keeps its library
    state = DraftState(DraftSpec(backend="native", model=smollm2, cores=[0], threads=1, n_ctx=256,
                                 scratch_dir=str(tmp_path)))
    assert state.backend == "llama.cpp"
    assert state.kernels.startswith("llama.cpp, weights as-is (no native draft: no C compiler ('no-such-compiler')")
    assert state.model.forward([1, 100], 0).shape == (state.model.n_vocab,)
    state.model.close()


def test_q5_0_blocks_become_q8_0_exactly_whatever_the_sign_of_their_scale():
    """gguf's Q5_0 stores d = max / -16, so most scales are negative."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=(4, 64)).astype(np.float32)
    blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q5_0)
    want = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q5_0)
    tensor = GGUFTensor("w", "Q5_0", 6, (64, 4), blocks)
    q, d = as_q8_0(tensor, 4, 64)
    scales = d.view(np.float16).astype(np.float32)
    assert (scales < 0).any()
    got = (q.reshape(4, 2, 32).astype(np.float32) * scales[..., None]).reshape(4, 64)
    assert np.array_equal(got, want)


# ---- Gemma 3 ------------------------------------------------------------------------

LONG = 620          # past the 512-position window of Gemma 3's sliding layers


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory):
    """Gemma 3's float32 target along its greedy path after a long prompt (its
    prompt cache, the logits at the prompt's end and after each token), and
    the native draft of the same file."""
    gemma = resolve_model("builtin:gemma3-270m")
    torch.set_num_threads(2)
    kv = KVModel(load_causal_lm(gemma, "float32"))
    sentence = "the river carried salt and timber past the old mill every spring while the town slept "
    prompt = [int(t) for t in Tokenizer(gemma).encode_prompt(sentence * (LONG // 10))][:LONG]
    logits = [kv.forward(prompt, 0)[-1]]
    tokens = []
    for i in range(16):
        tokens.append(int(logits[-1].argmax()))
        logits.append(kv.forward(tokens[-1:], len(prompt) + i)[-1])
    layers = list(kv.layer_kv(len(prompt) - 1))
    keys = np.stack([k.to(torch.float16).numpy() for k, _ in layers])
    values = np.stack([v.to(torch.float16).numpy() for _, v in layers])
    native = NativeModel(gemma.file, 1024, str(tmp_path_factory.mktemp("cache")))
    yield native, prompt, tokens, torch.stack(logits).numpy(), keys, values
    native.close()


def test_the_native_gemma_draft_follows_the_target_past_the_sliding_window(gemma_run):
    """Its own prefill of a prompt longer than the window, then the target's
    greedy path: the same token at every step (its largest logits, which the
    output layer recomputes in Q8_0, ~1.5% of their spread off on average:
    the K-quant matrices held as Q8_0)."""
    native, prompt, tokens, want, _, _ = gemma_run
    assert len(prompt) == LONG and native.description.startswith("native (")
    assert "Q8_0 from Q5_0" in native.description
    got = _path_logits(native, prompt, tokens)
    assert [int(row.argmax()) for row in got[:-1]] == tokens
    top = np.argsort(-got, axis=1)[:, :4]
    near = np.take_along_axis(got, top, 1) - np.take_along_axis(want, top, 1)
    assert np.abs(near).mean() < 0.03 * want.std(axis=1).mean()


def test_the_native_gemma_draft_takes_the_targets_prompt_cache(gemma_run):
    """The target hands its full-attention layers first, then the sliding ones;
    the draft puts each back in its place."""
    native, prompt, tokens, _, keys, values = gemma_run
    assert native.kv_geometry() == [18, 1, 256, 3]
    native.import_kv(keys, values)
    got = [native.forward(prompt[-1:], len(prompt) - 1).copy()]
    for i, token in enumerate(tokens):
        got.append(native.forward([token], len(prompt) + i).copy())
    assert [int(row.argmax()) for row in got[:-1]] == tokens


def test_an_engine_whose_native_draft_prefills_itself_stays_exact():
    """prompt_kv = "own": the native draft prefills a long prompt itself, in
    windows on its own core (borrowing none: the target decodes alone
    meanwhile), and the output is still the target's own."""
    notes = " ".join(f"Note {i}: the train left platform {i} at {8 + i % 9} o'clock." for i in range(12))
    messages = [{"role": "user", "content": "Summarize these notes in one sentence. " + notes}]
    # no lookup guesses: on these repetitive notes they would finish the request
    # before the draft's prefill does, and no round would speculate
    # the float32 target: slow enough that the draft's prefill ends long before the 128 tokens
    config = {"draft": {"backend": "native", "prompt_kv": "own", "prefill_borrows_target_cores": False},
              "target": {"backend": "transformers"},
              "decoding": {"lookup": 0}}
    with hetspec.launch(config) as engine:
        assert engine.info["draft"]["kernels"].startswith("native")
        want = engine.generate(messages=messages, max_new_tokens=128, mode="target")
        got = engine.generate(messages=messages, max_new_tokens=128, mode="duodec",
                              speculation="always")    # prefill whatever the cost model says
    assert got.stats["prompt_tokens"] > 100 and got.stats["draft_prompt_kv"] == "own"
    assert got.stats["target_only_rounds"] > 0          # the target went on alone while the draft prefilled
    assert got.token_ids == want.token_ids
    assert got.stats["spec_rounds"] > 0 and got.stats["accepted"] > 0, got.stats


def test_a_four_bit_draft_holds_its_layers_in_q4_1_and_still_agrees(tmp_path):
    """[draft] weights = "q4_1": Gemma 3's Q4_K, Q6_K and Q8_0 layers become Q4_1 (the
    output layer keeps its own blocks), and along the 8-bit draft's greedy path the
    4-bit one picks the same token at most positions."""
    path = resolve_model("builtin:gemma3-270m").file
    eight, four = (NativeModel(path, 256, str(tmp_path), four_bit=fb) for fb in (False, True))
    assert "Q4_1 from Q4_K" in four.description and "Q4_1 from" not in eight.description
    tokens = [2, 818, 5279, 529, 506, 2148, 563]
    agree = 0
    for step in range(24):
        feed, pos = (tokens[-1:], len(tokens) - 1) if step else (tokens, 0)
        want, got = eight.forward(feed, pos), four.forward(feed, pos)
        agree += int(got.argmax()) == int(want.argmax())
        tokens.append(int(want.argmax()))
    assert agree >= 18, agree
    eight.close()
    four.close()


def test_a_draft_vocabulary_cut_short_scores_its_first_tokens_only(tmp_path):
    """[draft] vocab: the steps' logits past the first `vocab` ids are -inf, and along
    the full draft's greedy path the cut one picks the full one's best of those ids;
    an engine with it stays the target's own greedy output and drafts nothing past them."""
    path = resolve_model("builtin:smollm2").file
    full, cut = (NativeModel(path, 256, str(tmp_path), vocab=v) for v in (0, 4096))
    assert "the first 4096 of 49152 tokens scored" in cut.description
    tokens = [1, 504, 3458, 282, 4649, 314]
    for step in range(16):
        feed, pos = (tokens[-1:], len(tokens) - 1) if step else (tokens, 0)
        want, got = full.forward(feed, pos), cut.forward(feed, pos)
        assert np.all(np.isneginf(got[4096:])) and np.isfinite(got[:4096]).all()
        assert int(got.argmax()) == int(want[:4096].argmax()), step
        tokens = tokens + [int(want.argmax())]
    full.close()
    cut.close()
    with hetspec.launch({"draft": {"vocab": 4096}, "decoding": {"gamma": 4, "lookup": 0}}) as engine:
        assert "first 4096" in engine.info["draft"]["kernels"]
        request = dict(prompt="The three primary colours are", max_new_tokens=48)
        want = engine.generate(**request, mode="target")
        got = engine.generate(**request, mode="sequential", speculation="always")
    assert got.token_ids == want.token_ids and got.stats["accepted"] > 0, got.stats
