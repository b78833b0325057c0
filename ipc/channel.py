"""zmq sockets that carry hetspec.ipc.messages, with timeouts instead of blocking forever.

A Channel is one end of a one-to-one link (DEALER to DEALER: either side may
send at any time). A Router is the scheduler's side of the client link, where
many clients each have an identity.
"""
from __future__ import annotations

import os
import stat

import zmq
import zmq.utils.monitor

from hetspec.ipc.codec import MAX_MESSAGE_BYTES, Malformed, decode, encode

MORE, NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)   # plain ints: pyzmq's flags are enums, ORed in Python


def send_frames(socket: zmq.Socket, frames: list[bytes], flags: int = 0) -> None:
    """socket.send_multipart(frames, flags), less its checks of every frame and its enum arithmetic:
    a few microseconds a message, and the scheduler sends several a round."""
    for frame in frames[:-1]:
        socket.send(frame, flags | MORE)
    socket.send(frames[-1], flags)


def _poller(socket: zmq.Socket) -> zmq.Poller:
    """A poller of the socket's incoming messages, made once (socket.poll makes one a call)."""
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    return poller


def make_runtime_dir(path: str) -> str:
    """The private directory for ipc:// endpoints: only this user may connect."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, stat.S_IRWXU)
    return path


def ipc_endpoint(runtime_dir: str, name: str) -> str:
    return f"ipc://{os.path.join(runtime_dir, name)}.sock"


class Channel:
    def __init__(self, context: zmq.Context, endpoint: str, bind: bool):
        self.endpoint = endpoint
        self.context, self.monitor = context, None
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 1000)   # let a last error message leave
        self.poller = _poller(self.socket)
        if bind:
            self.socket.bind(endpoint)
            self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.socket.connect(endpoint)

    def watch(self) -> None:
        """Record connection events, so peer_lost() can tell when the peer went away."""
        address = f"inproc://hetspec-monitor-{id(self):x}"
        self.socket.monitor(address, zmq.EVENT_DISCONNECTED)
        self.monitor = self.context.socket(zmq.PAIR)
        self.monitor.connect(address)
        self._lost = False

    def peer_lost(self) -> bool:
        """True once the connection to a watched peer has closed (its process died)."""
        while self.monitor is not None and self.monitor.poll(0):
            frames = self.monitor.recv_multipart()
            self._lost = self._lost or zmq.utils.monitor.parse_monitor_message(frames)["event"] == zmq.EVENT_DISCONNECTED
        return self.monitor is not None and self._lost

    def send(self, message) -> None:
        send_frames(self.socket, encode(message))

    def waiting(self, timeout_ms: int = 0) -> bool:
        """Whether a message has arrived (waiting up to timeout_ms for one)."""
        return bool(self.poller.poll(timeout_ms))

    def recv(self, timeout_s: float | None = None):
        """The next message, or None if nothing arrived within timeout_s."""
        if timeout_s is not None and not self.waiting(int(timeout_s * 1000)):
            return None
        return decode(self.socket.recv_multipart())

    def receive(self, timeout_s: float | None, between, every_s: float):
        """The next message, waiting at most timeout_s (None: no limit); between() runs
        after each every_s seconds of silence, to notice a dead peer (it raises).
        None if the time ran out."""
        waited = 0.0
        while (message := self.recv(every_s)) is None:
            between()
            waited += every_s
            if timeout_s is not None and waited >= timeout_s:
                return None
        return message

    def close(self) -> None:
        if self.monitor is not None:
            try:
                self.socket.monitor(None, 0)
            except zmq.ZMQError:      # the context is terminating: closing is all that is left
                pass
            self.monitor.close(linger=0)
        self.socket.close()


HEARTBEAT_MS = 2000           # tcp: a client host that vanished is noticed within the timeout
HEARTBEAT_TIMEOUT_MS = 10000


class Router:
    """Each client socket is one identity. A send to a client whose connection has
    closed (its process died, or it closed the socket) fails at once: that is how
    the scheduler learns a client is gone (ROUTER_MANDATORY). Messages to a slow
    reader queue without bound (SNDHWM 0) rather than being dropped."""

    def __init__(self, context: zmq.Context, endpoint: str):
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + 64)   # a larger frame disconnects its sender
        self.socket.bind(endpoint)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.poller = _poller(self.socket)

    waiting = Channel.waiting

    def send(self, identity: bytes, message) -> bool:
        """False if that client is gone."""
        try:
            send_frames(self.socket, [identity, *encode(message)], NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            if exc.errno in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                return False
            raise

    def recv_nowait(self):
        """(identity, message) or None; a malformed message comes back as (identity, Malformed)."""
        try:
            identity, *frames = self.socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        try:
            return identity, decode(frames)
        except Malformed as exc:
            return identity, exc

    def close(self) -> None:
        self.socket.close()
