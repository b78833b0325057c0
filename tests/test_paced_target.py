"""The paced target (workers/target/paced.py), a simulated GPU target: traces recorded by
the real target through the engine, then replayed behind the real scheduler, IPC and
draft. Greedy output equals the trace in every mode, with a draft that agrees and one
that does not; a pass takes its profile's time; what it cannot answer is a clear error
and the engine keeps serving."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hetspec
from hetspec.benchmarks.bench.paced import paced_config, record_missing
from hetspec.config import assign_cores, load_config
from hetspec.core.errors import ConfigError, HetspecError
from hetspec.core.gpu_profiles import PROFILES, profile
from hetspec.models import resolve_model
from hetspec.workers.target.traces import Trace, Traces, add_trace, load_traces, trace_file

SMOLLM2 = "builtin:smollm2"
PROMPTS = {"a": [1, 504, 3458, 282, 4649, 314, 2113, 30], "b": [1, 9519, 1183, 253, 1789, 28, 1041, 338, 3106]}
NEW_TOKENS = 40
DRAFTS = {"agrees": {"backend": "native", "model": SMOLLM2},
          "disagrees": {"backend": "torch", "model": "random:vocab=49152,seed=7,tokenizer=smollm2"}}


def _config(draft: dict, traces: str) -> dict:
    return paced_config({"target": {"model": SMOLLM2}, "draft": draft,
                         "decoding": {"speculation": "always"}, "server": {"max_context": 512}},
                        "h100-7b-captured", traces)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict:
    """The real (native) SmolLM2 target's greedy traces of PROMPTS, recorded through the engine."""
    folder = str(tmp_path_factory.mktemp("traces"))
    recorded = record_missing({"target": {"model": SMOLLM2}, "server": {"max_context": 512}}, PROMPTS,
                              dict.fromkeys(PROMPTS, NEW_TOKENS), folder, log=lambda _: None)
    assert recorded == len(PROMPTS)
    assert record_missing({"target": {"model": SMOLLM2}}, PROMPTS, dict.fromkeys(PROMPTS, NEW_TOKENS), folder,
                          log=lambda _: None) == 0            # all there now: nothing recorded twice
    found = load_traces(trace_file(resolve_model(SMOLLM2).file, folder))
    assert found and load_config(_config(DRAFTS["agrees"], "")).target.traces.endswith("traces")
    return {"folder": folder, "tokens": {tuple(t.prompt.tolist()): t.full[len(t.prompt):].tolist() for t in found}}


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_greedy_output_is_the_trace_in_every_mode(traces, draft):
    with hetspec.launch(_config(DRAFTS[draft], traces["folder"])) as engine:
        info = engine.get_info()
        assert info["target"]["backend"] == "paced" and info["target"]["device"] == "paced"
        assert info["keep_drafting"] is True                 # a target off the CPU: the draft never rests
        assert info["config"]["server"]["max_running"] == 8  # "auto" on the paced target
        for ids in PROMPTS.values():
            for mode in ("target", "sequential", "duodec"):
                result = engine.generate(ids, max_new_tokens=NEW_TOKENS, mode=mode, temperature=0.0)
                assert result.token_ids == traces["tokens"][tuple(ids)][:len(result.token_ids)], (draft, mode)
                assert len(result.token_ids) == NEW_TOKENS or result.finish_reason == "stop"
                if mode != "target":
                    assert result.stats["spec_rounds"] > 0


def test_a_pass_takes_its_profiles_time_and_bad_requests_are_refused(traces):
    captured = profile("h100-7b-captured")
    with hetspec.launch(_config(DRAFTS["agrees"], traces["folder"])) as engine:
        ids = PROMPTS["a"]
        start = time.perf_counter()
        result = engine.generate(ids, max_new_tokens=NEW_TOKENS, mode="target", temperature=0.0)
        # a prompt pass, then one pass a token (the target decodes ahead: no round trip)
        least = captured.pass_s(len(ids), 1) + (NEW_TOKENS - 1) * captured.pass_s(1, 1)
        assert least <= time.perf_counter() - start < least + 1.0
        with pytest.raises(HetspecError, match="greedy"):
            engine.generate(ids, max_new_tokens=8, temperature=0.7, seed=1)
        with pytest.raises(HetspecError, match="no recorded trace"):
            engine.generate([1, 2, 3, 4], max_new_tokens=8, temperature=0.0)
        with pytest.raises(HetspecError, match="past its recorded trace|past the recorded trace"):
            engine.generate(ids, max_new_tokens=NEW_TOKENS + 20, mode="target", temperature=0.0)
        again = engine.generate(ids, max_new_tokens=NEW_TOKENS, mode="duodec", temperature=0.0)
        assert again.token_ids == result.token_ids            # and it keeps serving


def test_a_context_that_leaves_its_trace_is_named():
    prompt = np.array([5, 6, 7])
    found = Traces([Trace(prompt, np.array([5, 6, 7, 8, 9, 10]), 3)], caches=1)
    assert found.full(0, np.array([5, 6, 7, 8])).tolist() == [5, 6, 7, 8, 9, 10]
    with pytest.raises(ValueError, match="left its recorded trace at position 4"):
        found.full(0, np.array([5, 6, 7, 8, 1]))
    with pytest.raises(ValueError, match="no recorded trace"):
        found.full(0, np.array([4, 6, 7]))


def test_the_longest_trace_of_a_prompt_is_kept(tmp_path):
    path = tmp_path / "t.jsonl"
    add_trace(path, [5, 6], [7, 8], 2)
    add_trace(path, [5, 6], [7, 8, 9, 10], 4)
    add_trace(path, [5, 6], [7], 1)
    (only,) = load_traces(path)
    assert only.full.tolist() == [5, 6, 7, 8, 9, 10] and only.covers(4) and not only.covers(5)


def test_profiles_charge_a_flat_window_then_per_token():
    p = PROFILES["gpu-40ms"]
    assert p.pass_s(1, 1) == p.pass_s(p.flat_to, p.flat_to) == pytest.approx(0.040)
    assert p.pass_s(p.flat_to + 4, p.flat_to + 4) == pytest.approx(0.040 + 4 * p.per_token_ms / 1000)
    assert p.pass_s(100, 1) == pytest.approx((p.window_ms + 100 * p.prefill_ms_per_token) / 1000)
    with pytest.raises(ValueError, match="unknown GPU profile 'h200'; known: h100-7b-eager"):
        profile("h200")


MEASURED = {"name": "h100-measured", "window_ms": 8.25, "flat_to": 16, "per_token_ms": 0.12,
            "prefill_ms_per_token": 0.04, "source": "measured: benchmarks/gpu_profile.py"}


def test_a_profile_loads_from_a_gpu_profile_report(tmp_path):
    """A report's paced_profile is a profile wherever a name is, the config included; a missing or
    malformed report is refused there, naming the file and what is wrong."""
    report = tmp_path / "profile.json"
    report.write_text(json.dumps({"curve": {}, "paced_profile": MEASURED}))
    p = profile(str(report))
    assert (p.name, p.window_ms, p.flat_to) == ("h100-measured", 8.25, 16)
    assert p.pass_s(20, 20) == pytest.approx((8.25 + 4 * 0.12) / 1000)
    assert load_config({"target": {"backend": "paced", "profile": str(report)}}).target.profile == str(report)
    bad = {"missing.json": None, "text.json": "not json", "none.json": json.dumps({"curve": {}}),
           "short.json": json.dumps({"paced_profile": {k: v for k, v in MEASURED.items() if k != "source"}}),
           "flat.json": json.dumps({"paced_profile": {**MEASURED, "flat_to": 0}}),
           "nan.json": json.dumps({"paced_profile": {**MEASURED, "window_ms": float("nan")}})}
    wrong = {"missing.json": "cannot read it", "text.json": "is not JSON", "none.json": "holds no paced_profile",
             "short.json": r"exactly the fields .*missing \['source'\]", "flat.json": "flat_to must be an integer >= 1",
             "nan.json": "window_ms must be a number > 0"}
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=wrong[name]):
            profile(str(tmp_path / name))
        with pytest.raises(ConfigError, match=f"\\[target\\] profile: GPU profile '.*{name}'.*{wrong[name]}"):
            load_config({"target": {"backend": "paced", "profile": str(tmp_path / name)}})


def test_a_paced_target_needs_a_profile_and_leaves_the_draft_every_core_the_schedulers_last():
    with pytest.raises(ConfigError, match="needs a profile"):
        load_config({"target": {"backend": "paced"}})
    with pytest.raises(ConfigError, match="profile must be one of"):
        load_config({"target": {"backend": "paced", "profile": "tpu"}})
    with pytest.raises(ConfigError, match="only it takes one"):
        load_config({"target": {"profile": "gpu-40ms"}})
    assert assign_cores("auto", "auto", "auto", target_on="host")[0] != ()
    cores = sorted({c for group in assign_cores("auto", "auto") for c in group})
    draft, target, scheduler = assign_cores("auto", "auto", "auto", target_on="paced")
    assert draft == tuple(cores[1:] + cores[:1]) and target == scheduler == (cores[0],)


def test_hetspec_bench_paced_writes_a_report_checked_against_the_traces(tmp_path):
    """The command a user runs: records its trace (untimed), runs the modes, titles the report
    by its profile, and finds every output equal to the trace; a bad profile or method is a
    usage error that names it."""
    command = [sys.executable, "-m", "hetspec.benchmarks.bench.cli", "--config", "smollm2", "--paced",
               "h100-7b-captured", "--categories", "code", "--limit", "1", "--max-new-tokens", "24",
               "--traces", str(tmp_path / "traces"), "--out", str(tmp_path / "out"), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("# Paced target (simulated GPU), profile h100-7b-captured")
    summary = json.loads((tmp_path / "out" / "results.json").read_text())["summary"]
    assert set(summary) == {"target", "lookup", "sps", "duodec"}
    assert all(s["runs"] == 1 and s["outputs_differing_from_trace"] == 0 and s["tokens_per_s"] > 0
               for s in summary.values())
    bad = subprocess.run([*command[:3], "--paced", "tpu"], capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "unknown GPU profile 'tpu'" in bad.stderr
    bad = subprocess.run([*command[:3], "--paced", "gpu-40ms", "--methods", "vanilla"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "engine methods only" in bad.stderr


def test_concurrent_requests_are_one_paced_pass_a_step_and_each_the_trace(traces):
    """Requests at once step together: each pass is charged once for all their tokens
    (a GPU batch), and each request's output is still its trace; batch_tokens 4 reads a
    prompt that joins in chunks, whose answers the paced target cannot know (nor need)."""
    config = _config(DRAFTS["agrees"], traces["folder"])
    config["server"] = {**config["server"], "batch_tokens": 4}
    with hetspec.launch(config) as engine:
        results = {}
        threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, engine.generate(
            PROMPTS[k], max_new_tokens=NEW_TOKENS, temperature=0.0)), daemon=True) for k in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for k, ids in PROMPTS.items():
            assert results[k].token_ids == traces["tokens"][tuple(ids)][:len(results[k].token_ids)]
        assert sum(r.stats["batched_rounds"] for r in results.values()) > 0
