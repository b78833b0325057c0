"""benchmarks/gpu_profile.py rehearsed on the CPU at tiny shapes, as scripts/gpu_check.sh runs it on
a lent GPU: the report's form (never its timings), and its paced_profile a profile the paced target
loads. The engine step (two engine launches) is left to the script's rehearsal
(GPU_CHECK_REHEARSE=1): CI's time is short."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from hetspec.benchmarks.gpu_profile import SIZES
from hetspec.core.gpu_profiles import GpuProfile, profile


def test_the_cpu_rehearsal_writes_a_report_whose_paced_profile_loads(tmp_path):
    out, summary = tmp_path / "profile.json", tmp_path / "report.md"
    command = [sys.executable, "-m", "hetspec.benchmarks.gpu_profile", "--device", "cpu", "--steps", "curve,generate",
               "--prompts", "1", "--tokens", "4", "--repeats", "2", "--out", str(out), "--report", str(summary)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["curve"]) == {"eager", "static", "captured"} and doc["engine"] == {} and doc["skipped"] == []
    for passes in doc["curve"].values():
        for n in SIZES:
            median, fastest = passes[str(n)]["wall_ms"]
            assert median >= fastest > 0 and passes[str(n)]["kernel_ms"] > 0     # the profiler's CPU ops, here
    assert doc["curve"]["captured"]["graphs"] == "run eagerly (no CUDA)"
    assert set(doc["paced_profile"]) == {field.name for field in dataclasses.fields(GpuProfile)}
    p = profile(str(out))
    assert p == GpuProfile(**doc["paced_profile"]) and p.window_ms > 0 and p.flat_to in SIZES
    assert doc["generate"]["eager"]["tokens_per_s"] > 0 and doc["generate"]["static"]["compiled"] is False
    assert "| captured |" in summary.read_text() and "| captured |" in done.stdout
