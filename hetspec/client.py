"""The Python handle on an engine: launch() one, or connect() to a running one.

Each call opens its own socket, so one Engine may be used from several
threads, and several clients may submit at once: the scheduler queues them.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import os
import threading
import time
import weakref
from dataclasses import dataclass, field

import psutil
import zmq

from hetspec.config import load_config
from hetspec.core.errors import EngineDeadError, EngineStartError, HetspecError, RequestAbortedError, error_from_kind
from hetspec.core.params import SamplingParams, check_prompt
from hetspec.ipc.channel import Channel
from hetspec.ipc.codec import encode
from hetspec.ipc.messages import (
    CancelRequest,
    EngineInfo,
    Finished,
    GenerateRequest,
    InfoRequest,
    RequestFailed,
    StopEngine,
    TokensEvent,
)
from hetspec.launcher import Launcher

POLL_S = 0.5
CONNECT_TIMEOUT_S = 60.0
_ids = itertools.count(int.from_bytes(os.urandom(3), "big") << 20)
_ids_lock = threading.Lock()


@dataclass
class Result:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: dict = field(default_factory=dict)


class Stream:
    """One request's text pieces, as they are committed. Its Result is in .result
    (and StopIteration.value) once it has finished; close() before then cancels it."""

    def __init__(self, engine: Engine, request: GenerateRequest):
        self.engine, self.request_id = engine, request.request_id
        self.result: Result | None = None
        self._channel = None             # set first: __del__ runs even if opening fails
        self._iterating = False          # a thread is inside __next__ (Engine.close leaves its socket to it)
        frames, self._generation = encode(request), engine._generation()   # (too large: a RequestError)
        self._channel = engine._channel(watch=engine._launcher is None and engine.endpoint.startswith("tcp://"))
        engine._streams.add(self)
        self._channel.socket.send_multipart(frames)

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> str:
        if self._channel is None and self.result is None:   # closed early
            raise StopIteration
        self._iterating = True
        try:
            while self.result is None:
                message = self.engine._receive(self._channel, generation=self._generation)
                if isinstance(message, TokensEvent) and message.text:
                    return message.text
                if isinstance(message, Finished):
                    self.result = self.engine.last_result = Result(message.text, message.token_ids,
                                                                   message.finish_reason, message.stats)
                elif isinstance(message, RequestFailed):
                    self.close(cancel=False)      # it ended already
                    raise error_from_kind(message.kind, message.message)
        except zmq.ContextTerminated:   # Engine.close() from another thread waits for this socket to close
            self.close(cancel=False)
            raise EngineDeadError("this engine handle was closed while the request was running") from None
        except BaseException:
            self.close()
            raise
        finally:
            self._iterating = False
        self.close()
        raise StopIteration(self.result)

    def close(self, cancel: bool = True) -> None:
        """Stop listening; a request not finished yet is cancelled."""
        if self._channel is None:
            return
        channel, self._channel = self._channel, None
        try:
            if cancel and self.result is None:   # never blocks, even with the engine gone
                channel.socket.send_multipart(encode(CancelRequest(self.request_id, self.engine.token)), zmq.NOBLOCK)
        except zmq.ZMQError:      # the engine is gone (or its queue full): nothing to cancel
            pass
        finally:
            channel.close()

    def __del__(self):
        self.close()


class Engine:
    def __init__(self, endpoint: str, launcher: Launcher | None = None, token: str = ""):
        self.endpoint = endpoint
        self.token = token            # the engine's [server] api_key, if it has one
        self._launcher = launcher
        self._context = zmq.Context()
        self._closed = False
        self._streams = weakref.WeakSet()   # open Streams: close() closes the idle ones, or term() would wait
        self.last_result: Result | None = None
        self.info: dict = {}

    # ---- requests --------------------------------------------------------------

    def generate(self, prompt=None, *, messages=None, params: SamplingParams | None = None, **overrides) -> Result:
        """Generate a completion of a prompt (text or token ids) or of chat messages;
        returns when it is finished. Parameters: a SamplingParams, and/or its fields
        as keywords (max_new_tokens=32, temperature=0.7, ...)."""
        stream = self.stream(prompt, messages=messages, params=params, **overrides)
        for _ in stream:
            pass
        return stream.result   # this call's own Result (self.last_result may be another thread's by now)

    def stream(self, prompt=None, *, messages=None, params: SamplingParams | None = None, **overrides) -> Stream:
        """As generate, but returns at once: a Stream that yields text pieces as tokens
        are committed. Closing it early (or Engine.cancel) cancels the request."""
        params = SamplingParams.make(params, **overrides)
        prompt = check_prompt(prompt, messages)
        with _ids_lock:
            request_id = next(_ids)
        return Stream(self, GenerateRequest(request_id, prompt, messages, dataclasses.asdict(params), self.token))

    def cancel(self, request_id: int) -> None:
        """Stop a request (from any thread): it ends within one round with finish_reason
        "cancelled" and the tokens it has; a queued one ends before it starts."""
        channel = self._channel()
        try:
            channel.send(CancelRequest(request_id, self.token))
        finally:
            channel.close()

    def get_info(self, timeout_s: float | None = None) -> dict:
        """What the engine measured and chose at start-up (gamma, costs, cores...)."""
        channel = self._channel()
        try:
            message = None
            while message is None:      # asked again when the scheduler it went to died
                generation = self._generation()
                channel.send(InfoRequest(self.token))
                with contextlib.suppress(RequestAbortedError):
                    message = self._receive(channel, timeout_s, generation)
        finally:
            channel.close()
        if isinstance(message, RequestFailed):
            raise error_from_kind(message.kind, message.message)
        self.info = message.info
        return self.info

    # ---- plumbing ----------------------------------------------------------------

    def _channel(self, watch: bool = False) -> Channel:
        """A socket of its own; watched: one whose wait notices the engine's end at once
        (over tcp, where no process of it can be looked up)."""
        if self._closed:
            raise HetspecError("this engine handle is closed")
        try:
            channel = Channel(self._context, self.endpoint, bind=False)
            if watch:
                channel.watch()
            return channel
        except zmq.ZMQError as exc:     # closed from another thread meanwhile, or a malformed endpoint
            raise HetspecError(f"cannot reach the engine at {self.endpoint}: {exc}") from None

    def _receive(self, channel: Channel, timeout_s: float | None = None, generation: int | None = None):
        """Wait for the scheduler's next message, noticing if the engine died, or if the
        scheduler that held this request (of `generation`) did."""
        def between():
            if self._closed:
                raise EngineDeadError("this engine handle was closed while the request was running")
            self.check_alive()
            self._check_scheduler(generation, channel)

        message = channel.receive(timeout_s, between, POLL_S)
        if message is None:
            raise EngineDeadError(f"no engine answered at {self.endpoint} within {timeout_s:g} s")
        return message

    def check_alive(self) -> None:
        """Raise EngineDeadError if the engine cannot serve any more: its scheduler was
        given up (it kept dying) or stopped, or (connected over ipc) it is gone and no
        launcher is left to start it again. Workers are restarted by the scheduler, and
        the scheduler by its launcher: neither is its clients' concern."""
        if self._launcher is not None:
            if death := self._launcher.death():
                raise EngineDeadError(death)
        elif self._scheduler_gone() and not _alive(self.info.get("launcher_pid")):
            raise EngineDeadError(f"the engine at {self.endpoint} (scheduler pid {self.info['pid']}) is gone")

    def _check_scheduler(self, generation: int | None, channel: Channel) -> None:
        """RequestAbortedError if the scheduler that held a request has died since: it is
        started again (so the engine serves on), but the request went with it."""
        launcher, why = self._launcher, None
        if launcher is not None and generation is not None and launcher.generation != generation:
            why = f"the engine's scheduler died ({launcher.last_death()})"
        elif launcher is None and self._scheduler_gone():
            why = f"the engine's scheduler (pid {self.info['pid']}) died"
            self.info["pid"] = None          # its launcher starts another: later requests wait for it
        elif launcher is None and channel.peer_lost():
            why = f"the engine at {self.endpoint} closed the connection (its scheduler died or was stopped)"
        if why:
            raise RequestAbortedError(f"{why} while this request ran; it is started again and the engine keeps "
                                      "serving: send the request again")

    def _scheduler_gone(self) -> bool:
        return bool(self.info.get("pid")) and self.endpoint.startswith("ipc://") and not _alive(self.info["pid"])

    def _generation(self) -> int | None:
        """Which start of the scheduler a request sent now goes to (launched engines)."""
        return None if self._launcher is None else self._launcher.current_generation()

    def restarting(self) -> str | None:
        """Why the engine's scheduler is starting again, while it is (launched engines)."""
        return self._launcher.restarting() if self._launcher is not None else None

    def close(self) -> None:
        """Stop what launch() started; a connect()ed handle only lets go."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._launcher is not None:
                self._launcher.stop_supervising()     # the scheduler is about to leave: that is no death
                channel = Channel(self._context, self.endpoint, bind=False)
                channel.send(StopEngine(self.token))
                channel.close()
        finally:
            for stream in list(self._streams):   # abandoned, not yet collected: their sockets would block term()
                if not stream._iterating:
                    stream.close(cancel=False)
            deadline = time.monotonic() + 2 * POLL_S + 1
            while any(s._channel is not None for s in list(self._streams)) and time.monotonic() < deadline:
                time.sleep(0.05)                 # a thread in one sees _closed within POLL_S and closes it
            self._context.term()
            if self._launcher is not None:
                self._launcher.stop()
                self._launcher = None

    def __enter__(self) -> Engine:  # noqa: PYI034 (typing.Self needs Python 3.11; 3.10 is supported)
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def launch(config=None) -> Engine:
    """Start an engine (None: the embedded default; a shipped name, a TOML path or a dict)."""
    config = load_config(config)
    launcher = Launcher(config)
    engine = Engine(launcher.endpoints.client, launcher, config.server.api_key)
    atexit.register(engine.close)
    try:
        launcher.start()
        engine.endpoint = _wait_ready(engine, launcher, config.server.startup_timeout_s)
        launcher.watch()
    except BaseException:
        engine.close()
        raise
    return engine


def _wait_ready(engine: Engine, launcher: Launcher, timeout_s: float) -> str:
    """Ask for the engine's info; it answers once both workers are loaded and measured."""
    channel = engine._channel()
    try:
        channel.send(InfoRequest(engine.token))
        message = channel.receive(timeout_s, launcher.check, POLL_S)
    finally:
        channel.close()
    if message is None:
        raise EngineStartError(f"the engine did not start within {timeout_s:.0f} s")
    if not isinstance(message, EngineInfo):
        raise EngineStartError(message.message if isinstance(message, RequestFailed) else f"the engine answered {message}")
    engine.info = message.info
    return message.info["endpoint"]


def connect(endpoint: str, timeout_s: float = CONNECT_TIMEOUT_S, token: str = "") -> Engine:
    """A handle on an engine started elsewhere (e.g. by hetspec-launch); raises
    EngineDeadError if no engine answers there within timeout_s. token: the
    engine's API key, if it was started with one."""
    if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://"):]):
        raise EngineDeadError(f"no engine at {endpoint}: the socket does not exist")
    engine = Engine(endpoint, token=token)
    try:
        engine.get_info(timeout_s)
    except BaseException:
        engine.close()
        raise
    return engine


def _alive(pid) -> bool:
    return bool(pid) and psutil.pid_exists(pid)
