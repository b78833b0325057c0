"""The concurrency benchmark (benchmarks/concurrency.py) on the default pair, served for real by
`hetspec-launch --http`, and with --paced by the engine in-process on a paced target: 1 and 2
clients at once, 8 tokens. The report's numbers must be
consistent (tokens add up, rates and latencies positive, p50 <= p99), every output must equal its
request served alone, and the server must leave nothing behind; the timings themselves are never
checked. Also llama-server's command, and the clear error where it is not built."""
from __future__ import annotations

from pathlib import Path

import pytest

from hetspec.benchmarks import concurrency
from hetspec.benchmarks.bench import llama_bin
from hetspec.core.errors import ConfigError
from hetspec.models import resolve_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 8


def _default_pair_or_skip() -> None:
    try:
        resolve_model("builtin:smollm2")
    except (ConfigError, ImportError) as exc:
        pytest.skip(f"the default pair's file is not installed: {exc}")


@pytest.fixture(scope="module")
def doc():
    _default_pair_or_skip()
    return concurrency.run("smollm2", [1, 2], max_tokens=TOKENS, log=lambda _: None)


def test_every_pass_adds_up(doc):
    engine = doc["engines"]["hetspec"]
    assert set(engine["passes"]) == {"1", "2"} and len(engine["alone"]) == 2
    for n, p in engine["passes"].items():
        requests = p["requests"]
        assert p["n"] == int(n) == len(requests)
        assert p["tokens"] == sum(r["tokens"] for r in requests)
        assert p["aggregate_tokens_per_s"] == pytest.approx(p["tokens"] / p["wall_s"])
        assert p["vs_sequential"] == pytest.approx(p["aggregate_tokens_per_s"] / p["sequential_tokens_per_s"])
        assert p["summed_decode_tokens_per_s"] > 0 and p["sequential_tokens_per_s"] > 0
        assert 0 < p["itl_p50_ms"] <= p["itl_p99_ms"] and 0 < p["ttft_mean_s"] <= p["ttft_max_s"] <= p["wall_s"]
        for r in requests:
            times = [t for t, _ in r["chunks"]]
            assert 0 < r["tokens"] <= TOKENS and sum(k for _, k in r["chunks"]) == r["tokens"]
            assert times == sorted(times) and 0 < r["ttft_s"] <= r["total_s"]
            assert r["ttft_s"] == pytest.approx(times[0], abs=1e-4)
            assert len(r["gaps_s"]) == r["tokens"] - r["chunks"][0][1]


def test_outputs_equal_alone_and_nothing_is_left(doc):
    for p in doc["engines"]["hetspec"]["passes"].values():
        assert p["equal_alone"] == p["n"] and p["differ"] == []
        assert all(r["text"] for r in p["requests"])
    assert doc["leftovers"] == []


def test_the_report_shows_each_pass(doc, tmp_path):
    concurrency.write(doc, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "## hetspec" in report and "| 1 |" in report and "| 2 |" in report and "2/2" in report
    assert (tmp_path / "results.json").stat().st_size > 1000


def test_a_paced_target_serves_the_same_passes(tmp_path):
    """--paced: the config's own target records the traces (untimed), then the engine in this
    process, its target paced as a GPU, serves the requests alone and at once; every output is
    its request alone's, the drafting is counted, and the report names the profile."""
    _default_pair_or_skip()
    doc = concurrency.run("smollm2", [1, 2], max_tokens=TOKENS, paced="gpu-40ms", traces=str(tmp_path / "traces"),
                          log=lambda _: None)
    (name, engine), = doc["engines"].items()
    assert name == "hetspec, paced gpu-40ms" and engine["target"]["backend"] == "paced"
    assert set(engine["passes"]) == {"1", "2"} and len(engine["alone"]) == 2
    for n, p in engine["passes"].items():
        assert p["n"] == int(n) and p["equal_alone"] == p["n"]
        assert p["tokens"] == sum(r["tokens"] for r in p["requests"]) and 0 <= p["accepted"] <= p["drafted"]
        assert all(0 < r["tokens"] <= TOKENS and sum(k for _, k in r["chunks"]) == r["tokens"] for r in p["requests"])
    concurrency.write(doc, tmp_path / "out")
    assert "paced by gpu-40ms" in (tmp_path / "out" / "report.md").read_text()


def test_chunk_counts_follow_the_text_and_end_at_usage():
    def words(text: str) -> int:              # a stand-in tokenizer: one token a word
        return len(text.split())

    assert concurrency.chunk_counts(["a b", " c", " d e"], 5, words) == [2, 1, 2]
    assert concurrency.chunk_counts(["a b", " c"], 2, words) == [2, 0]        # never past the server's count
    assert concurrency.chunk_counts(["a", "b"], 2, words) == [1, 1]           # "ab" re-tokenized as one: the usage rules


def test_llama_servers_command():
    command = llama_bin.server_command(Path("/b/llama-server"), "t.gguf", 4, 1024, 2, [0, 1], 8080, repack=False)
    command = command[command.index("/b/llama-server"):]         # after taskset's own "-c" where it pins
    assert command[command.index("-np") + 1] == "4" and command[command.index("-c") + 1] == "4096"
    assert command[-1] == "--no-repack"
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("-t") + 1] == "2"


def test_a_missing_llama_server_names_the_build_command(monkeypatch):
    _default_pair_or_skip()
    monkeypatch.setattr(llama_bin, "find_server", lambda: None)
    with pytest.raises(SystemExit, match=r"scripts/build_llama_cpp.sh --server"):
        concurrency.run("smollm2", [1], peer="llama-server", log=lambda _: None)     # before hetspec starts


def test_ci_never_builds_llama_server():
    """CI runs scripts/setup.sh --dev near its time limit: llama-server stays opt-in."""
    for path in ("scripts/setup.sh", ".ci/run", "scripts/gpu_check.sh"):
        assert "--server" not in (ROOT / path).read_text(), path
