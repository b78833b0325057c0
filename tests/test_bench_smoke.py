"""CI smoke run of the benchmark suite (hetspec-bench): one prompt, one category,
every method, greedy and sampled, a few tokens. It checks that the report and
results.json are produced and that the numbers are consistent (token counts
match, rates are positive), never the timings themselves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetspec.benchmarks.bench.checks import check_results
from hetspec.benchmarks.bench.llama_bin import kept_tree
from hetspec.benchmarks.bench.methods import FORCED, METHODS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NEW_TOKENS = 8
PER_RUN = [name for name, m in METHODS.items() if m.kind != "cpp"]     # a record per run in doc["runs"]
TRANSFORMERS_PAIR = Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / "smollm2-transformers.toml"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # The default pair with its float32 target, which hands the draft its prompt cache: with
    # the native target (the default on a CPU) the draft prefills the prompt itself while the
    # target decodes alone, and 8 tokens end before a forced method's first window.
    command = [sys.executable, "-m", "hetspec.benchmarks.bench.cli", "--config", str(TRANSFORMERS_PAIR), "--limit", "1",
               "--categories", "qa", "--methods", "all", "--max-new-tokens", str(NEW_TOKENS), "--out", str(out),
               "--quiet"]
    # From outside the checkout, as an installed console script runs: only hetspec.* may resolve.
    done = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False, cwd=out)
    assert done.returncode == 0, f"hetspec-bench failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return out, json.loads((out / "results.json").read_text())


def test_outputs_are_written(smoke):
    out, _ = smoke
    report = (out / "report.md").read_text()
    for heading in ("Table 1 (greedy)", "Table 1 (sampling)", "Table 2", "Per-round time profile",
                    "Number of draft sequences", "Consistency checks"):
        assert heading in report


def test_every_method_ran_and_the_checks_pass(smoke):
    _, doc = smoke
    assert check_results(doc) == [] and doc["checks"] == []
    assert set(doc["methods"]) == set(PER_RUN)           # llama.cpp's binaries: doc["llama_cpp"]
    assert len(doc["runs"]) == len(PER_RUN) * 2


def _qa_cells(doc):
    """(decoding, method, its qa cell, its runs) for every method with a record per run."""
    for decoding in ("greedy", "sampling"):
        for method in PER_RUN:
            runs = [r for r in doc["runs"] if r["method"] == method and r["decoding"] == decoding]
            yield decoding, method, doc["results"][decoding][method]["qa"], runs


def test_each_cell_adds_up_its_runs(smoke):
    _, doc = smoke
    for decoding, method, cell, runs in _qa_cells(doc):
        assert all(r["new_tokens"] == len(r["token_ids"]) > 0 for r in runs)
        assert cell["new_tokens"] == sum(r["new_tokens"] for r in runs)
        assert cell["tokens_per_s"] == pytest.approx(cell["new_tokens"] / cell["total_s"])
        assert cell["tokens_per_s"] > 0 and cell["speedup"] > 0 and cell["ttft_rel"] > 0
        assert doc["results"][decoding][method]["average"]["speedup"] == pytest.approx(cell["speedup"])


def test_engine_methods_speculate_as_asked(smoke):
    _, doc = smoke
    for _, method, cell, runs in _qa_cells(doc):
        if METHODS[method].kind == "engine" and METHODS[method].mode == "lookup":   # the target and its guesses alone
            assert cell["spec_rounds"] == 0 and all(r["drafted"] == 0 and r["fallback"] is None for r in runs)
        elif METHODS[method].kind == "engine" and METHODS[method].mode != "target":
            _assert_speculation(doc, method, cell, runs)


def _assert_speculation(doc, method, cell, runs):
    forced = METHODS[method].speculation == FORCED
    assert doc["methods"][method]["speculation"] == (FORCED if forced else "auto")
    if forced:                       # an ablation measures its configuration: it never rests
        assert all(r["rested"] == 0 for r in runs) and cell["spec_rounds"] > 0
    elif cell["spec_rounds"] == 0:   # judged by the clock: a whole run may rest, or never start the draft
        assert all(r["rested"] > 0 or r["fallback"] for r in runs)
        return
    assert 0 <= cell["acceptance_rate"] <= 1
    assert 1 <= cell["mean_accepted_per_round"] <= NEW_TOKENS


def test_greedy_token_counts_match_vanilla(smoke):
    _, doc = smoke
    greedy = [r for r in doc["runs"] if r["decoding"] == "greedy"]
    vanilla = next(r for r in greedy if r["method"] == "vanilla")
    assert {r["method"]: r["new_tokens"] for r in greedy} == {r["method"]: vanilla["new_tokens"] for r in greedy}


def test_results_json_schema(smoke):
    _, doc = smoke
    assert doc["schema"] == "hetspec-bench/1"
    assert isinstance(doc["chosen_gamma"], int) and doc["chosen_gamma"] >= 1
    assert doc["machine"]["logical_cores"] >= 1 and doc["settings"]["dtype"] == "float32"
    for key in ("tokens_per_s", "speedup", "ttft_rel", "acceptance_rate", "mean_accepted_per_round"):
        assert key in doc["results"]["greedy"]["duodec"]["average"]


# ---- the checks themselves, on a synthetic document (no models, instant) -----------

def _synthetic_doc() -> dict:
    from hetspec.benchmarks.bench.metrics import aggregate

    def run(method, decoding, seconds, **extra):
        return {"method": method, "category": "qa", "question_id": 1, "decoding": decoding, "prompt_tokens": 10,
                "max_new_tokens": 4, "token_ids": [5, 6, 7, 8], "new_tokens": 4, "finish_reason": "length",
                "total_s": seconds, "ttft_s": seconds / 4, "gamma": None, **extra}

    spec = {"gamma": 3, "spec_rounds": 1, "drafted": 3, "accepted": 2, "committed_in_spec_rounds": 3,
            "sequences_hist": {"1": 1}, "draft_s": 0.1, "verify_s": 0.2, "round_s": 0.25, "overhead_s": 0.05}
    runs = [run("vanilla", d, 1.0) for d in ("greedy", "sampling")]
    runs += [run("duodec", d, 0.5, **spec) for d in ("greedy", "sampling")]
    doc = {"settings": {"methods": ["vanilla", "duodec"], "categories": ["qa"],
                        "decodings": {"greedy": {}, "sampling": {}}},
           "methods": {"vanilla": {"gamma": None}, "duodec": {"gamma": 3}}, "chosen_gamma": 3, "runs": runs}
    doc["results"] = aggregate(doc)
    return doc


def test_checks_pass_a_consistent_document():
    doc = _synthetic_doc()
    assert check_results(doc) == []
    cell = doc["results"]["greedy"]["duodec"]["qa"]
    assert cell["speedup"] == pytest.approx(2.0) and cell["ttft_rel"] == pytest.approx(0.5)
    assert cell["acceptance_rate"] == pytest.approx(2 / 3) and cell["mean_accepted_per_round"] == 3
    assert cell["exact_match"] == 1.0
    assert doc["results"]["greedy"]["vanilla"]["qa"]["acceptance_rate"] is None


@pytest.mark.parametrize("damage, message", [
    (lambda r: r.update(new_tokens=3), "reports 3 new tokens but returned 4"),
    (lambda r: r.update(accepted=5), "accepted 5 of 3 drafted"),
    (lambda r: r.update(committed_in_spec_rounds=1), "committed 1 != accepted 2"),
    (lambda r: r.update(sequences_hist={"1": 2}), "sequence histogram counts 2 rounds"),
    (lambda r: r.update(ttft_s=9.0), "times: ttft"),
    (lambda r: r.update(error="RequestError: boom"), "failed: RequestError: boom"),
])
def test_checks_catch_inconsistencies(damage, message):
    from hetspec.benchmarks.bench.metrics import aggregate

    doc = _synthetic_doc()
    damage(doc["runs"][2])
    doc["results"] = aggregate(doc)
    assert any(message in p for p in check_results(doc)), check_results(doc)


@pytest.mark.integration
def test_the_forced_overlap_script_runs(capsys):
    """`python -m hetspec.benchmarks.mode_ab --speculation always`, short, on the embedded
    default: every mode speculates where forced, and keeps the target alone's greedy tokens."""
    from hetspec.benchmarks import mode_ab

    # 48 tokens: the draft prefills the prompt itself (a native target keeps its cache) while
    # the target decodes the first ones alone
    assert mode_ab.main(["--config", "smollm2", "--modes", "duodec", "sequential", "target", "--speculation", "always",
                         "--categories", "qa", "--limit", "1", "--max-new-tokens", "48", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "prompts whose greedy outputs differ between modes: 0" in out      # the target alone's among them
    for mode in ("duodec", "sequential"):
        line = next(line for line in out.splitlines() if line.strip().startswith(mode))
        assert int(line.split(", ")[1].split()[0]) > 0      # speculative rounds


def test_the_llama_cpp_binary_rows(smoke):
    """llama.cpp's own binaries: where built, every C++ row ran and the report's "vs llama.cpp"
    divides decode tok/s by llama-bench's; where not, one line says how to build them."""
    out, doc = smoke
    section, report = doc["llama_cpp"], (out / "report.md").read_text()
    assert "Avg. vs llama.cpp" in report and not any(m["kind"] == "peer" for m in doc["methods"].values())
    if section.get("missing"):
        assert "scripts/build_llama_cpp.sh" in section["missing"] and section["missing"] in report
        assert kept_tree() is None, "scripts/setup.sh --dev kept llama-cpp-python's build tree but built no binaries"
        return
    assert set(section["methods"]) | set(section["skipped"]) == {n for n, m in METHODS.items() if m.kind == "cpp"}
    assert section["runs"] and all("error" not in r and r["decode_tokens_per_s"] > 0 for r in section["runs"])
    bench = section["results"]["llama-bench"]["qa"]["decode_tokens_per_s"]
    duodec = doc["results"]["greedy"]["duodec"]["qa"]["decode_tokens_per_s"]
    assert section["vs"]["greedy"]["duodec"]["qa"] == pytest.approx(duodec / bench)
    assert "llama.cpp's own binaries (C++)" in report and "over `llama-bench`'s" in report


# ---- llama.cpp's binaries: commands and parsers (captured outputs), no build in CI ------

LLAMA_OUTPUTS = Path(__file__).parent / "data" / "llama_cpp"


def test_llama_cpp_commands():
    from hetspec.benchmarks.bench import llama_bin

    bench = llama_bin.bench_command(Path("/b"), "m.gguf", 2, 150, 96, [0, 1])
    assert bench[bench.index("/b/llama-bench"):] == ["/b/llama-bench", "-m", "m.gguf", "-t", "2", "-p", "0", "-n",
                                                      "96", "-d", "150", "-r", "3", "-o", "json"]
    if bench[0] == "taskset":
        assert bench[:3] == ["taskset", "-c", "0,1"]
    assert llama_bin.bench_command(Path("/b"), "m.gguf", 1, 8, 4, [], repack=False)[-2:] == ["--repack", "0"]
    spec = llama_bin.spec_command(Path("/b"), "t.gguf", 2, "p.txt", 64, 300, [], draft="d.gguf", n_max=8)
    assert spec[:3] == ["/b/llama-speculative-simple", "-m", "t.gguf"]
    for flag, value in (("-md", "d.gguf"), ("--spec-draft-n-max", "8"), ("--temp", "0"), ("-f", "p.txt"),
                        ("-n", "64"), ("-t", "2"), ("-td", "2")):
        assert spec[spec.index(flag) + 1] == value
    ngram = llama_bin.spec_command(Path("/b"), "t.gguf", 2, "p.txt", 64, 300, [], spec_type="ngram-mod")
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod" and "-md" not in ngram


def test_llama_cpp_parsers_on_captured_output():
    """The outputs of the vendored llama.cpp's binaries, captured on the development machine."""
    from hetspec.benchmarks.bench import llama_bin

    bench = llama_bin.parse_bench_json((LLAMA_OUTPUTS / "llama-bench.json").read_text())
    assert [(t["n_depth"], t["n_gen"], t["n_prompt"], t["threads"]) for t in bench] == [(150, 96, 0, 2)]
    assert bench[0]["tokens_per_s"] > 0 and len(bench[0]["samples_ts"]) == 3
    spec = llama_bin.parse_spec_output((LLAMA_OUTPUTS / "speculative-simple.txt").read_text())
    assert spec["n_max"] == 8 and 0 <= spec["accepted"] <= spec["drafted"] and spec["new_tokens"] >= 32
    assert spec["decode_tokens_per_s"] == pytest.approx(spec["new_tokens"] / spec["decode_s"])
    assert llama_bin.parse_load_ms((LLAMA_OUTPUTS / "completion.txt").read_text()) > 0
    with pytest.raises(ValueError):
        llama_bin.parse_spec_output("no timings here")
    with pytest.raises(ValueError):
        llama_bin.parse_bench_json("[]")


def test_llama_cpp_binaries_when_built():
    """Against the real binaries where scripts/build_llama_cpp.sh built them (seconds), skipped otherwise."""
    from hetspec.benchmarks.bench import llama_bin
    from hetspec.models import resolve_model

    bin_dir = llama_bin.find_binaries()
    if bin_dir is None:
        pytest.skip(llama_bin.missing_line())
    from hetspec.workers.common.llama_handles import repacked_weights_run

    model = resolve_model("builtin:smollm2").file
    # as the suite runs them: without llama.cpp's repacked weights where those die here (AMX in a VM)
    peer = llama_bin.LlamaBinaries(bin_dir, model, model, sorted(os.sched_getaffinity(0)),
                                   lambda ids: "The capital of France is", repack=repacked_weights_run(model))
    try:
        bench = peer.run("bench", 1, list(range(32)), 4)
        assert bench["depth"] == 32 and bench["new_tokens"] == 4 and bench["decode_tokens_per_s"] > 0
        spec = peer.run("spec", 1, [1, 2, 3], 8)
        assert spec["n_max"] == llama_bin.DRAFT_LENGTH and spec["decode_tokens_per_s"] > 0
        for mode in ("ngram-simple", "ngram-mod"):
            assert peer.run(mode, 1, [1, 2, 3], 8)["decode_tokens_per_s"] > 0
    finally:
        peer.close()


def test_the_mode_ab_script_runs(capsys):
    """`python -m hetspec.benchmarks.mode_ab`, short, on the embedded default: modes take
    turns per prompt, and their greedy outputs agree."""
    from hetspec.benchmarks import mode_ab

    assert mode_ab.main(["--modes", "target", "duodec", "--categories", "code", "--limit", "1",
                         "--max-new-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "prompts whose greedy outputs differ between modes: 0" in out
    assert out.count("code/1") == 2 and "1.00x target" in out
