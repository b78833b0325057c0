"""Helpers for the tests: tiny random models (no files) and references to compare with;
an engine's processes, what they leave behind, and the CLI serving (test_lifecycle.py,
test_faults.py), every wait bounded."""
from __future__ import annotations

import glob
import os
import queue
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import psutil
import pytest
import torch

from hetspec.core.sampling import probabilities
from hetspec.models import resolve_model
from hetspec.workers.common.hf_loading import load_causal_lm

if TYPE_CHECKING:
    from hetspec.launcher import Launcher

TARGET = "random:seed=0"
WEAK_DRAFT = "random:seed=1"          # a different random model: disagrees often
# The short form CI runs: the tests of a sampled law draw a third of their samples (their
# bounds widen by sqrt(3), as the noise does), and tests marked FULL are skipped (each a
# slower twin of one CI keeps: another weight type, the other shipped file, a longer soak).
# HETSPEC_FULL_TESTS=1 (scripts/full_tests.sh) runs them all, with every sample.
FULL_TESTS = os.environ.get("HETSPEC_FULL_TESTS") == "1"
FULL = pytest.mark.full
DEADLINE_S = 60          # generous bound for anything that must not hang (the machine may be busy)
CLI_TIMEOUT_S = 180


def isa_params() -> list:
    """HETSPEC_ISA's values for a kernel test: native, and AVX2 alone. Without AVX-512 the kernels compile the same
    code for both (their only branches are AVX-512's), so CI's short form runs native alone there."""
    from hetspec.benchmarks.bench.machine import _cpuinfo

    avx2 = "avx2" if "avx512f" in _cpuinfo("flags").split() else pytest.param("avx2", marks=FULL)
    return ["native", avx2]


def full_only(*values, keep=()):
    """Parameters for parametrize: those in `keep` run in CI too, the others in the full form only."""
    return [v if v in keep else pytest.param(v, marks=FULL) for v in values]


def draws(full: int) -> int:
    """How many samples a test of a sampled law takes: `full` in the full form, a third in CI's."""
    return full if FULL_TESTS else full // 3


def noise_scale(n: int, full: int) -> float:
    """How much wider a bound set for `full` draws is at n: sampling noise goes as 1 / sqrt(n)."""
    return (full / n) ** 0.5


def random_engine_config(draft=TARGET, target=TARGET, **decoding):
    """speculation "always": tests of the speculative paths must not see them rested
    (a weak draft would be), except tests of that rest (test_gate.py)."""
    return {"draft": {"backend": "torch", "model": draft}, "target": {"model": target},
            "decoding": {"gamma": 4, "speculation": "always", **decoding}}


def load_reference(spec: str, dtype: str = "float32", device: str = "cpu"):
    return load_causal_lm(resolve_model(spec), dtype, device)


def reference_greedy(model, prompt_ids, max_new_tokens):
    """The target's own greedy decoding (transformers generate, on the model's device), new tokens only."""
    ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt_ids):].tolist()


def explain_mismatch(model, prompt_ids, got, expected) -> str:
    """Where outputs differ, show the target's top-2 margin there: a float tie flips an
    argmax legitimately only when that margin is tiny."""
    i = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    ids = torch.tensor([prompt_ids + expected[:i]])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    top = torch.topk(logits, 2)
    return (f"first difference at new token {i}: got {got[i:i + 3]}, expected {expected[i:i + 3]}; "
            f"target top-2 {top.indices.tolist()} with logit margin {float(top.values[0] - top.values[1]):.3g}")


def conditional(model, ids, temperature, top_k, top_p):
    """The target's own sampling distribution after ids."""
    with torch.no_grad():
        logits = model(torch.tensor([list(ids)])).logits[0, -1:].numpy()
    return probabilities(logits, temperature, top_k, top_p)[0].astype(np.float64)


def exact_joint(model, prompt, vocab, temperature, top_k=0, top_p=1.0):
    """P(x1, x2, x3 | prompt) under the target's own sampling, by enumeration."""
    p1 = conditional(model, prompt, temperature, top_k, top_p)
    joint = np.zeros((vocab, vocab, vocab))
    for a in range(vocab):
        p2 = conditional(model, [*prompt, a], temperature, top_k, top_p)
        for b in range(vocab):
            joint[a, b] = p1[a] * p2[b] * conditional(model, [*prompt, a, b], temperature, top_k, top_p)
    return joint


def total_variation(a, b):
    return 0.5 * np.abs(a - b).sum()


# ---- an engine's processes, and what they leave behind ------------------------------------

@dataclass
class Footprint:
    """Everything one engine created, recorded while it runs."""
    run_id: str
    runtime_dir: str
    processes: list[psutil.Process]      # scheduler, workers, and their own children

    @classmethod
    def of(cls, launcher: Launcher) -> Footprint:
        processes = []
        for popen in launcher.processes.values():
            try:
                process = psutil.Process(popen.pid)
                processes += [process, *process.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return cls(launcher.run_id, launcher.runtime_dir, processes)

    def segments(self) -> list[str]:
        return glob.glob(f"/dev/shm/hetspec-{self.run_id}-*")


def assert_nothing_left(footprint: Footprint, children_before: set[psutil.Process]) -> None:
    # No child of this test process remains (beyond those that existed before this engine).
    leftover = set(psutil.Process().children(recursive=True)) - children_before
    assert not leftover, f"child processes left: {leftover}"
    # Every process the engine started, grandchildren included (they would be re-parented,
    # not children any more), is gone or goes within the bound.
    assert_exit(footprint.processes)
    assert not _processes_mentioning(footprint.runtime_dir)
    assert footprint.segments() == []
    assert not os.path.exists(footprint.runtime_dir)


def assert_exit(processes: list[psutil.Process]) -> None:
    """All of processes are gone, or go within the bound (a zombie counts as gone)."""
    _, alive = psutil.wait_procs(processes, timeout=DEADLINE_S)
    assert not [p for p in alive if _running(p)], f"processes left: {alive}"


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


def children() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


def start_long_request(engine):
    """A 2000-token request streaming in another thread; (thread, box) where the box
    receives its "result" or its "error". Returns once tokens are flowing."""
    streaming = threading.Event()
    box = {}

    def long_request():
        try:
            for _ in engine.stream("Hello", max_new_tokens=2000):
                streaming.set()
            box["result"] = engine.last_result
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    thread = threading.Thread(target=long_request, daemon=True)
    thread.start()
    assert streaming.wait(DEADLINE_S), "the request never streamed"
    return thread, box


def call_within(timeout_s: float, fn, *args, **kwargs):
    """Run fn in a thread; fail if it has not returned within timeout_s. Returns (value, exception)."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} did not return within {timeout_s} s"
    return box.get("value"), box.get("error")


# ---- the CLI ----------------------------------------------------------------------------------

def write_toml(directory) -> str:
    path = os.path.join(directory, "random.toml")
    with open(path, "w") as f:
        f.write(f'[draft]\nbackend = "torch"\nmodel = "{WEAK_DRAFT}"\n\n[target]\nmodel = "{TARGET}"\n\n'
                f'[decoding]\ngamma = 4\n')
    return path


def orphaned_segments() -> list[str]:
    """hetspec's /dev/shm segments whose engine's process is gone (a run id begins with its
    pid): what an engine left behind, and not another engine's, running beside the test."""
    pids = {n: n.split("-")[1] for n in os.listdir("/dev/shm") if n.startswith("hetspec-")}
    return [n for n, pid in pids.items() if not (pid.isdigit() and psutil.pid_exists(int(pid)))]


def cli_leftovers(pid: int) -> tuple[list[str], list[str], list[psutil.Process]]:
    """Segments, runtime directories and processes of any engine the CLI process `pid` started
    (its run ids begin with its pid)."""
    runtime_prefix = os.path.join(tempfile.gettempdir(), f"hetspec-{pid}-")
    return (glob.glob(f"/dev/shm/hetspec-{pid}-*"), glob.glob(f"{runtime_prefix}*"),
            _processes_mentioning(runtime_prefix))


def start_serving(toml: str, stderr=subprocess.PIPE) -> tuple[subprocess.Popen, str, list[psutil.Process]]:
    """hetspec-launch serving `toml`, once it has printed its endpoint: (its process, the
    endpoint, the engine's processes). Killed again if it does not get that far."""
    proc = subprocess.Popen([sys.executable, "-m", "hetspec.cli", toml], stdout=subprocess.PIPE,
                            stderr=stderr, text=True)
    try:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
        try:
            endpoint = lines.get(timeout=CLI_TIMEOUT_S).strip()
        except queue.Empty:
            pytest.fail("hetspec-launch printed no endpoint")
        assert endpoint.startswith("ipc://"), endpoint
        engine_processes = psutil.Process(proc.pid).children(recursive=True)
        assert len(engine_processes) >= 3
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, endpoint, engine_processes
