"""Pinning: while a worker borrows the other's core, torch's compute threads
each run on a core of their own (two of them sharing one made a 2-thread
prefill up to twice as slow), and afterwards everything is back on the
worker's own core.

Run in a child process, so the test runner's own affinity is never touched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, time
import torch
from hetspec.workers.common.thread_pinning import borrowed_cores, pin_threads, set_torch_threads

own, lent = [1], [0]

def stat(tid):
    fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])          # utime + stime, in clock ticks

def busy_threads(work):
    # the threads that computed `work`: every thread whose CPU time grew
    before = {t: stat(t) for t in os.listdir("/proc/self/task")}
    work()
    return sorted(t for t in os.listdir("/proc/self/task") if stat(t) - before.get(t, 0) >= 5)

def work():
    x = torch.randn(1500, 1500)
    deadline = time.perf_counter() + 0.6
    while time.perf_counter() < deadline:
        x @ x

set_torch_threads(1)
pin_threads(own, 1)
work()
main = str(os.getpid())
with borrowed_cores(own, lent, set_torch_threads, 1):
    busy = busy_threads(work)
    during = {t: sorted(os.sched_getaffinity(int(t))) for t in busy}
after = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
print(json.dumps({"main": main, "during": during, "after": after}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
                    or not {0, 1} <= os.sched_getaffinity(0), reason="needs cores 0 and 1 (Linux)")
def test_borrowed_cores_give_each_compute_thread_its_own_core():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    during = report["during"]
    assert len(during) == 2, during                      # two threads computed, one a core
    assert during[report["main"]] == [1]                 # the worker's main thread stays on its own core
    assert sorted(cores[0] for cores in during.values()) == [0, 1]
    assert all(len(cores) == 1 for cores in during.values()), during
    assert all(cores == [1] for cores in report["after"].values()), report["after"]
