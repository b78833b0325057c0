"""What every worker process does around its model: connect, say hello,
attach the shared buffers, answer commands, and leave when told to or when
its parent is gone (so a killed launcher never leaves orphans)."""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import signal
import sys
import traceback

import zmq

from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import AttachBuffers, Attached, Idle, Shutdown, WorkerFailed
from hetspec.ipc.shm import attach_all

POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def parse_args(argv, spec_type):
    """(the scheduler's endpoint, this worker's spec: a hetspec.ipc.specs type)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--spec", required=True, help="JSON: this worker's settings")
    args = parser.parse_args(argv)
    return args.endpoint, spec_type.from_json(args.spec)


class StartAfresh(Exception):
    """Raised by a worker's load: this process cannot go on (CUDA's allocator after a failed
    capture, say), so it is replaced by a new one of the same command line, `env` added."""

    def __init__(self, why: str, env: dict[str, str]):
        super().__init__(why)
        self.env = env


def serve(role: str, endpoint: str, spec, load, handlers: dict, recover=None) -> int:
    """load(spec) -> (hello, state); handlers[MessageType](state, message, buffers) -> reply,
    or (reply, background): an iterator of progress messages, worked through
    after the reply until the next message arrives (see DraftExtended).
    recover(state), if given, puts the state right after a handler raised. A load that
    raises StartAfresh is replaced by a new process (the same pid: exec), before its hello."""
    parent = os.getppid()
    _die_with_parent()
    context = zmq.Context()
    channel = Channel(context, endpoint, bind=False)
    loop = None
    try:
        try:
            hello, state = load(spec)
        except StartAfresh as again:
            print(f"{role} worker starts afresh: {again}", file=sys.stderr)
            channel.close()
            context.term()
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(sys.executable, sys.orig_argv, {**os.environ, **again.env})
        except Exception as exc:  # noqa: BLE001 - any load failure is reported (and logged), then we exit
            traceback.print_exc(file=sys.stderr)
            message = f"{role} worker could not load its model: {_describe(exc)}"
            print(message, file=sys.stderr)
            channel.send(WorkerFailed(role, message))
            return 1
        release_freed_memory()
        gc.freeze()             # the model's objects leave the collector's view: no full scan of them mid-round
        channel.send(hello)
        loop = CommandLoop(role, channel, state, handlers, recover)
        while True:
            message = channel.recv(POLL_S)
            if message is None and os.getppid() != parent:   # the launcher is gone: so are we
                return 0
            if message is not None and not loop.answer(message):
                return 0
    finally:
        for buffer in (loop.buffers if loop else {}).values():
            buffer.close()
        channel.close()
        context.term()


class CommandLoop:
    """A loaded worker's answers to the scheduler's messages."""

    def __init__(self, role: str, channel: Channel, state, handlers: dict, recover):
        self.role, self.channel, self.state, self.handlers, self.recover = role, channel, state, handlers, recover
        self.buffers = {}

    def answer(self, message) -> bool:
        """Carry out one message; False: it was Shutdown."""
        if isinstance(message, Shutdown):
            return False
        if isinstance(message, Idle):       # arriving, it stopped the background work: that was all
            return True
        if isinstance(message, AttachBuffers):
            self.buffers = attach_all(message.buffers)
            self.channel.send(Attached(self.role))
            return True
        try:
            reply = self.handlers[type(message)](self.state, message, self.buffers)
            reply, background = reply if isinstance(reply, tuple) else (reply, None)
            self.channel.send(reply)
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            traceback.print_exc(file=sys.stderr)
            if self.recover is not None:
                self.recover(self.state)
            self.channel.send(WorkerFailed(self.role, f"{self.role} worker: {_describe(exc)}", fatal=False))
            return True
        if background is not None:
            _work_until_next_message(self.channel, background)
        return True


def release_freed_memory() -> None:
    """Hand back to the system what loading freed in the C heap (the weights' conversions),
    which glibc would keep. Elsewhere than glibc, nothing."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker as soon as the scheduler that started it
    dies, even by SIGKILL and mid-computation (elsewhere the parent poll above remains)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _work_until_next_message(channel: Channel, background) -> None:
    """Each step of `background` is one unit of work (a draft forward pass) and
    yields a message to send; the next incoming message stops it, so extra work
    never delays a command by more than one step."""
    try:
        while not channel.waiting():
            progress = next(background, None)
            if progress is None:
                return
            channel.send(progress)
    except Exception:  # noqa: BLE001 - optional work: its command was answered already, so only log
        traceback.print_exc(file=sys.stderr)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown of torch and friends (seconds, for
    nothing: buffers and sockets are closed already)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
