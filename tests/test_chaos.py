"""hetspec-chaos in its short form: a few kills of the draft, the target and clients
under load (and a short soak), on the tiny random pair. The committed run
(benchmarks/reports/chaos/) is the long form on the embedded default."""
from __future__ import annotations

import json
import subprocess
import sys

from helpers import FULL, WEAK_DRAFT, random_engine_config

CONFIG = random_engine_config(draft=WEAK_DRAFT)


def run_chaos(tmp_path, *args) -> dict:
    toml = tmp_path / "random.toml"
    toml.write_text(f'[draft]\nbackend = "torch"\nmodel = "{WEAK_DRAFT}"\n[target]\nmodel = "{CONFIG["target"]["model"]}"\n'
                    '[decoding]\ngamma = 4\n')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "hetspec.benchmarks.robustness.chaos", "--config", str(toml),
                           "--out", str(out), *args], check=False, capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]     # 1: a check failed (the table says which)
    return json.loads((out / "chaos.json").read_text())


def test_a_few_kills_lose_nothing_and_leave_nothing(tmp_path):
    report = run_chaos(tmp_path, "--kills", "6", "--clients", "4", "--min-gap", "0.3", "--max-gap", "1.5",
                       "--seed", "3")
    counts, kills = report["counts"], report["kills"]
    assert sum(kills.values()) == 6
    assert counts["hung"] == counts["lost to a draft kill"] == counts["inexact"] == counts["other errors"] == 0
    assert counts["exact"] > 0     # how many requests fit between the kills depends on the machine
    assert report["restarts"]["draft"] >= kills["draft"] and report["restarts"]["target"] >= kills["target"]
    assert report["leaks"] == {"processes": [], "segments": [], "runtime_dir": False,
                               "other engines' segments": report["leaks"]["other engines' segments"]}


@FULL
def test_a_short_soak_holds_memory_steady(tmp_path):
    report = run_chaos(tmp_path, "--kills", "0", "--requests", "150", "--settle", "50", "--clients", "4")
    assert report["counts"]["requests"] >= 150
    assert sorted(map(int, report["memory"])) == [50, 150]
    assert report["problems"] == []
