"""A worker whose load cannot go on in its process (the transformers target after a failed CUDA
capture, which can leave the allocator unusable: captured.CaptureFailed) is replaced by a fresh
process of the same command line, told why (workers/common/process.StartAfresh): one hello
reaches the scheduler, from the same pid (exec), carrying the reason; and a fresh target
process runs its passes eagerly and says so in its kernels line."""
import subprocess
import sys

import zmq

from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import Shutdown, WorkerHello

WORKER = """
import os, sys
from hetspec.ipc.messages import WorkerHello
from hetspec.workers.common.process import StartAfresh, serve

def load(spec):
    if "WHY" not in os.environ:
        raise StartAfresh("a capture failed", {"WHY": "a capture failed"})
    return WorkerHello("target", os.getpid(), 8, "cpu", [0], 1, 0.0, kernels="eager: " + os.environ["WHY"]), None

sys.exit(serve("target", sys.argv[1], None, load, {}))
"""


def test_a_worker_that_starts_afresh_says_hello_once_from_the_same_pid_with_the_reason(tmp_path):
    context = zmq.Context()
    channel = Channel(context, f"ipc://{tmp_path}/worker", bind=True)
    worker = subprocess.Popen([sys.executable, "-c", WORKER, channel.endpoint], stderr=subprocess.PIPE, text=True)
    try:
        hello = channel.recv(60)
        assert isinstance(hello, WorkerHello) and hello.pid == worker.pid
        assert hello.kernels == "eager: a capture failed"
        assert channel.recv(1) is None                     # the first process said nothing
        channel.send(Shutdown())
        assert worker.wait(30) == 0
        assert "target worker starts afresh: a capture failed" in worker.stderr.read()
    finally:
        worker.kill()
        channel.close()
        context.term()


def test_the_fresh_target_process_runs_eagerly_and_says_why(monkeypatch):
    from hetspec.ipc.specs import TargetSpec
    from hetspec.models import resolve_model
    from hetspec.workers.target.transformers_target import EAGER_BECAUSE, TransformersTarget

    monkeypatch.setenv(EAGER_BECAUSE, "recording a pass failed (operation not permitted when stream is capturing)")
    spec = TargetSpec(model=resolve_model("random:seed=3"), dtype="auto", device="cpu", cores=[0], threads=1,
                      passes="captured", n_ctx=64, max_window=5)
    target = TransformersTarget(spec)
    assert target.passes == "eager"
    assert "passes eager, started afresh: recording a pass failed (operation not permitted" in target.kernels
    assert target.run(0, [1, 2, 3], 0, 1, False).shape == (1, 320)
