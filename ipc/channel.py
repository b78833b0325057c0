"""zmq sockets that carry hetspec.ipc.messages, with timeouts instead of blocking forever.

A Channel is one end of a one-to-one link (DEALER to DEALER: either side may
send at any time). A Router is the scheduler's side of the client link, where
many clients each have an identity.
"""
from __future__ import annotations

import os
import stat

import zmq

from hetspec.ipc.messages import decode, encode


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
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 1000)   # let a last error message leave
        if bind:
            self.socket.bind(endpoint)
            self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.socket.connect(endpoint)

    def send(self, message) -> None:
        self.socket.send_multipart(encode(message))

    def recv(self, timeout_s: float | None = None):
        """The next message, or None if nothing arrived within timeout_s."""
        if timeout_s is not None and not self.socket.poll(int(timeout_s * 1000)):
            return None
        return decode(self.socket.recv_multipart())

    def close(self) -> None:
        self.socket.close()


class Router:
    def __init__(self, context: zmq.Context, endpoint: str):
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)   # a departed client must not block us
        self.socket.bind(endpoint)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def send(self, identity: bytes, message) -> None:
        self.socket.send_multipart([identity, *encode(message)])

    def recv_nowait(self):
        """(identity, message) or None; a malformed message comes back as (identity, ValueError)."""
        try:
            identity, *frames = self.socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        try:
            return identity, decode(frames)
        except (ValueError, TypeError) as exc:
            return identity, ValueError(str(exc))

    def close(self) -> None:
        self.socket.close()
