"""Bad input to the hetspec-launch CLI: one line on stderr, a non-zero exit, no traceback
(the Python API's answers: test_bad_input.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

DRAFT = "random:seed=1"
TARGET = "random:seed=0"
CLI_TIMEOUT_S = 180


def write_toml(path, draft=DRAFT, target=TARGET, extra="") -> str:
    path.write_text(f'[draft]\nbackend = "torch"\nmodel = "{draft}"\n\n[target]\nmodel = "{target}"\n\n'
                    f'[decoding]\ngamma = 4\n{extra}')
    return str(path)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetspec.cli", *args], check=False, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    assert lines[0].startswith("hetspec-launch: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert proc.stdout == ""


@pytest.mark.parametrize("args, needles", [
    (["--prompt", ""], ["prompt is empty"]),
    (["--prompt", "hi", "--max-new-tokens", "0"], ["max_new_tokens"]),
    (["--prompt", "hi", "--temperature", "-1"], ["temperature"]),
    (["--prompt", "hi", "--top-p", "0"], ["top_p"]),
    (["--prompt", "hi", "--top-p", "1.5"], ["top_p"]),
    (["--prompt", "hi", "--mode", "turbo"], ["unknown mode", "turbo"]),
    (["--prompt", "hi", "--max-new-tokens", "many"], ["--max-new-tokens", "many"]),
    (["--no-such-flag"], ["--no-such-flag"]),
    (["--prompt", os.fsdecode(b"caf\xe9")], ["the prompt is not valid text", "lone surrogate (U+DCE9)"]),
], ids=["empty-prompt", "max-new-tokens-zero", "temperature-negative", "top-p-zero", "top-p-above-one",
        "unknown-mode", "max-new-tokens-not-a-number", "unknown-flag", "argv-not-utf8"])
def test_cli_bad_arguments(tmp_path, args, needles):
    toml = write_toml(tmp_path / "random.toml")
    assert_one_line_error(run_cli(toml, *args), *needles)


def test_cli_unknown_config_key(tmp_path):
    toml = write_toml(tmp_path / "typo.toml", extra="gama = 8\n")
    assert_one_line_error(run_cli(toml, "--prompt", "hi"), "gama", "[decoding]")


def test_cli_missing_config_file(tmp_path):
    missing = str(tmp_path / "missing.toml")
    assert_one_line_error(run_cli(missing, "--prompt", "hi"), "config file not found", missing)
    assert_one_line_error(run_cli(missing), "config file not found", missing)      # serve mode too


def test_cli_missing_model_file(tmp_path):
    toml = write_toml(tmp_path / "nomodel.toml", target="/nonexistent/target.gguf")
    assert_one_line_error(run_cli(toml, "--prompt", "hi"), "/nonexistent/target.gguf")


def test_cli_engine_start_error(tmp_path):
    toml = write_toml(tmp_path / "mismatch.toml", draft="random:vocab=300,tokenizer=smollm2")
    assert_one_line_error(run_cli(toml, "--prompt", "hi"), "tokenizer has 49152 tokens")
