"""What every worker process does around its model: connect, say hello,
attach the shared buffers, answer commands, and leave when told to or when
its parent is gone (so a killed launcher never leaves orphans)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import zmq

from ipc.channel import Channel
from ipc.messages import AttachBuffers, Attached, Shutdown, WorkerFailed
from ipc.shm import attach_all

POLL_S = 0.5


def parse_args(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--spec", required=True, help="JSON: this worker's settings")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    spec["endpoint"] = args.endpoint
    return spec


def serve(role: str, spec: dict, load, handlers: dict) -> int:
    """load(spec) -> (hello, state); handlers[MessageType](state, message, buffers) -> reply."""
    parent = os.getppid()
    context = zmq.Context()
    channel = Channel(context, spec["endpoint"], bind=False)
    buffers = {}
    try:
        try:
            hello, state = load(spec)
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, then we exit
            channel.send(WorkerFailed(role, f"{role} worker could not load its model: {_describe(exc)}"))
            return 1
        channel.send(hello)
        while True:
            message = channel.recv(POLL_S)
            if message is None:
                if os.getppid() != parent:      # the launcher is gone: so are we
                    return 0
                continue
            if isinstance(message, Shutdown):
                return 0
            if isinstance(message, AttachBuffers):
                buffers = attach_all(message.buffers)
                channel.send(Attached(role))
                continue
            try:
                channel.send(handlers[type(message)](state, message, buffers))
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                traceback.print_exc(file=sys.stderr)
                channel.send(WorkerFailed(role, f"{role} worker: {_describe(exc)}", fatal=False))
    finally:
        for buffer in buffers.values():
            buffer.close()
        channel.close()
        context.term()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown of torch and friends (seconds, for
    nothing: buffers and sockets are closed already)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
