"""llama-cpp-python is the extra "llama": the embedded default (native target, native
draft) starts and generates without it, the end-of-generation tokens it used to give
come from the GGUF file's own metadata (workers/common/gguf_vocab.py) and agree with it,
and a llama.cpp backend without it fails at start in one line naming the extra."""
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from hetspec.models import resolve_model
from hetspec.workers.common.extras import LLAMA_EXTRA, require_llama_cpp
from hetspec.workers.common.gguf_vocab import end_of_generation_tokens

TIMEOUT_S = 300
SHIPPED = {"smollm2": "builtin:smollm2", "gemma3-270m": "builtin:gemma3-270m"}


def _other_ggufs() -> list[str]:
    """GGUF files installed by some package, in the Hugging Face cache, or named by
    HETSPEC_TEST_GGUF (paths joined by os.pathsep), besides the shipped ones."""
    found = {str(dist.locate_file(f)) for dist in importlib.metadata.distributions() for f in dist.files or ()
             if f.name.endswith(".gguf")}
    hub = Path.home() / ".cache" / "huggingface" / "hub"
    found |= {str(p) for p in hub.rglob("*.gguf")} if hub.is_dir() else set()
    found |= {p for p in os.environ.get("HETSPEC_TEST_GGUF", "").split(os.pathsep) if p}
    shipped = {os.path.realpath(resolve_model("builtin:smollm2").file)}
    return sorted(p for p in found if os.path.isfile(p) and os.path.realpath(p) not in shipped)


def llama_cpp_eog(path: str) -> list[int]:
    """llama.cpp's own answer: the ids llama_vocab_is_eog is true of."""
    llama_cpp = pytest.importorskip("llama_cpp")
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
    assert model, f"llama.cpp could not read {path}"
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        return [t for t in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("name", list(SHIPPED) + _other_ggufs())
def test_end_of_generation_tokens_are_llama_cpps(name):
    path = resolve_model(SHIPPED[name]).file if name in SHIPPED else name
    assert end_of_generation_tokens(path) == llama_cpp_eog(path)


BASE = [f"t{i}" for i in range(16)]
VOCABULARIES = {   # tokenizer model, token texts, tokenizer.ggml.<name>_token_id keys
    "spm, eos by default, FIM pad and file separator by text": ("llama", BASE + ["<|im_end|>", "<PAD>", "<|file_sep|>"],
                                                               {}),
    "bpe, eos by default": ("gpt2", BASE + ["<|end|>"], {}),
    "harmony: <|end|> is no end": ("gpt2", BASE + ["<|end|>", "<|return|>", "<|call|>"], {"eos": 3}),
    "solar: <|end|> is no end": ("gpt2", BASE + ["<|end|>", "<|flush|>", "<|calls|>"], {"eos": 3}),
    "tool responses: </s> is no end": ("llama", BASE + ["</s>", "<|tool_response>"], {"eos": 16}),
    "eos outside the vocabulary": ("llama", BASE, {"eos": 999}),
    "every id named": ("llama", BASE, {"eos": 4, "eot": 5, "eom": 6, "fim_pad": 7, "fim_rep": 8, "fim_sep": 9}),
    "default eos outside a short vocabulary": ("gpt2", ["a", "b", "c"], {}),
}


def write_vocabulary(path: str, model: str, tokens: list[str], ids: dict) -> None:
    """A GGUF file of metadata only, as much as llama.cpp reads with vocab_only."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    if model == "gpt2":
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_merges(["t 1"])
    else:
        writer.add_token_scores([0.0] * len(tokens))
        writer.add_token_types([1] * len(tokens))
    for name, value in ids.items():
        writer.add_uint32(f"tokenizer.ggml.{name}_token_id", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("case", list(VOCABULARIES))
def test_each_branch_of_the_rule_is_llama_cpps(tmp_path, case):
    path = str(tmp_path / "vocab.gguf")
    write_vocabulary(path, *VOCABULARIES[case])
    assert end_of_generation_tokens(path) == llama_cpp_eog(path)


def test_a_missing_llama_cpp_is_named_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)       # import llama_cpp raises ImportError
    with pytest.raises(ImportError) as raised:
        require_llama_cpp("the llama.cpp target backend")
    message = str(raised.value)
    assert message.startswith("the llama.cpp target backend needs llama-cpp-python: ")
    assert LLAMA_EXTRA in message and "\n" not in message


@pytest.fixture
def no_llama_cpp(tmp_path) -> dict:
    """An environment whose Python processes, the workers hetspec.launcher starts
    included, cannot import llama_cpp: a module of that name first on PYTHONPATH."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "llama_cpp.py").write_text('raise ImportError("llama_cpp is blocked by this test")\n')
    paths = [str(shim), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def _python(code: str, env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)


def test_the_native_path_imports_no_llama_cpp(tmp_path):
    code = ("import sys\n"
            "import hetspec.workers.target.worker, hetspec.workers.target.gguf_target\n"
            "import hetspec.workers.draft.worker, hetspec.workers.common.native_model\n"
            "from hetspec.models import resolve_model\n"
            "resolve_model('builtin:smollm2')\n"
            "print('llama_cpp' in sys.modules)")
    done = _python(code, dict(os.environ), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def test_the_default_engine_runs_without_llama_cpp(no_llama_cpp, tmp_path):
    code = ("import json\n"
            "try:\n    import llama_cpp\n    blocked = False\nexcept ImportError:\n    blocked = True\n"
            "import hetspec\n"
            "with hetspec.launch() as engine:\n"
            "    result = engine.generate('The capital of France is', max_new_tokens=4)\n"
            "    info = engine.get_info()\n"
            "print(json.dumps({'blocked': blocked, 'tokens': len(result.token_ids),\n"
            "                  'target': info['target']['backend'], 'draft': info['draft']['backend']}))")
    done = _python(code, no_llama_cpp, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"blocked": True, "tokens": 4, "target": "native", "draft": "native"}


@pytest.mark.parametrize("section, what", [("target", "the llama.cpp target backend"),
                                           ("draft", "the llama.cpp draft backend")])
def test_a_llama_cpp_backend_without_the_extra_fails_in_one_line(no_llama_cpp, tmp_path, section, what):
    config = tmp_path / "llama.toml"
    config.write_text(f'[{section}]\nbackend = "llama.cpp"\n')
    done = subprocess.run([sys.executable, "-m", "hetspec.cli", str(config), "--prompt", "hi", "--max-new-tokens", "2"],
                          env=no_llama_cpp, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("hetspec-launch: error: ") and "Traceback" not in done.stderr
    assert f"{what} needs llama-cpp-python: {LLAMA_EXTRA}" in lines[0]
    assert "hetspec[llama]" in lines[0]
