"""The scheduler's side of its clients: one ROUTER socket, the queue of requests
waiting their turn, cancels, deadlines, and the count of how requests ended.

A client is gone when a send to it fails (ipc.channel.Router): its request is
then cancelled like one whose client asked.
"""
from __future__ import annotations

import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass

from hetspec.ipc.channel import Router
from hetspec.ipc.messages import CancelRequest, Finished, GenerateRequest, RequestFailed, TokensEvent

MAX_EARLY_CANCELS = 1024


@dataclass
class Pending:
    """A request in the queue, and when it must be done by (timeout_s, from arrival)."""
    identity: bytes
    message: GenerateRequest
    deadline: float | None
    retried: bool = False          # run again once already: its target died before its first token

    @property
    def id(self) -> int:
        return self.message.request_id


class Clients:
    def __init__(self, context, endpoint: str, max_queue: int, api_key: str | None):
        self.router = Router(context, endpoint)
        self.endpoint = self.router.endpoint
        self.max_queue, self.api_key = max_queue, api_key
        self.queue: deque[Pending] = deque()
        self.running: Pending | None = None   # the request being decoded
        self.cancelled: set[int] = set()      # ... or one not seen yet, asked to stop (CancelRequest)
        self.counts = Counter()               # requests by how they ended: completed, cancelled, timeout...

    def send(self, identity: bytes, message) -> bool:
        """False if that client is gone."""
        return self.router.send(identity, message)

    def read(self, timeout_ms: int) -> list[tuple[bytes, object]]:
        """Queue requests and apply cancels that arrived; answer what is malformed,
        unauthorized or over the queue's bound; return the rest (info, stop) for the
        scheduler to answer."""
        if not self.router.socket.poll(timeout_ms):
            return []
        others = []
        while (item := self.router.recv_nowait()) is not None:
            identity, message = item
            if isinstance(message, ValueError):
                self.send(identity, RequestFailed(-1, "request", f"malformed message: {message}"))
            elif not self._authorized(message):
                rid = getattr(message, "request_id", -1)
                self.send(identity, RequestFailed(rid, "auth", "this engine needs its API key (the token)"))
            elif isinstance(message, GenerateRequest) and message.request_id in self.cancelled:
                self.cancelled.discard(message.request_id)    # cancelled before it arrived
                self.finish_early(identity, message.request_id, "cancelled")
            elif isinstance(message, GenerateRequest) and len(self.queue) + (self.running is not None) > self.max_queue:
                self.counts["busy"] += 1   # (when idle, the first in the queue runs at once)
                self.send(identity, RequestFailed(message.request_id, "busy", "the engine is busy: "
                                                  f"{len(self.queue)} requests are waiting ([server] max_queue)"))
            elif isinstance(message, GenerateRequest):
                self.queue.append(Pending(identity, message, _deadline(message)))
            elif isinstance(message, CancelRequest):
                self._cancel(message.request_id)
            else:
                others.append((identity, message))
        return others

    def next(self) -> Pending | None:
        """The next request whose client is still there, now running."""
        while self.queue:
            pending = self.queue.popleft()
            if self.send(pending.identity, TokensEvent(pending.id, [], "")):   # an empty event: is anyone there?
                self.running = pending
                return pending
            self.counts["cancelled"] += 1
        return None

    def done(self) -> None:
        if self.running is not None:
            self.cancelled.discard(self.running.id)   # a cancel that came too late is forgotten
        self.running = None

    def must_stop(self) -> str | None:
        """Why the running request must end now, if it must: "cancelled" or "timeout"."""
        if self.running.id in self.cancelled:
            return "cancelled"
        if self.running.deadline is not None and time.monotonic() >= self.running.deadline:
            return "timeout"
        return None

    def expire(self) -> None:
        """Queued requests past their deadline end without running."""
        now = time.monotonic()
        for pending in [p for p in self.queue if p.deadline is not None and p.deadline <= now]:
            self.queue.remove(pending)
            self.finish_early(pending.identity, pending.id, "timeout")

    def finish_early(self, identity: bytes, rid: int, reason: str) -> None:
        """End a request that never ran: no tokens."""
        self.counts[reason] += 1
        self.send(identity, Finished(rid, [], "", reason, {"finish_reason": reason, "new_tokens": 0}))

    def refuse_all(self, message: str) -> None:
        """Never leave a client waiting (the engine is stopping)."""
        while self.queue:
            pending = self.queue.popleft()
            self.send(pending.identity, RequestFailed(pending.id, "dead", message))

    def _cancel(self, rid: int) -> None:
        """A queued request ends at once, the running one at its next round, and one
        not seen yet (its cancel overtook it on another socket) as soon as it arrives."""
        for pending in list(self.queue):
            if pending.id == rid:
                self.queue.remove(pending)
                self.finish_early(pending.identity, rid, "cancelled")
                return
        if len(self.cancelled) > MAX_EARLY_CANCELS:   # ids of requests that finished before their cancel
            self.cancelled.clear()
        self.cancelled.add(rid)

    def _authorized(self, message) -> bool:
        return not self.api_key or secrets.compare_digest(str(getattr(message, "token", "")).encode(),
                                                          self.api_key.encode())

    def close(self) -> None:
        self.router.close()


def _deadline(message: GenerateRequest) -> float | None:
    """When the request must end (its timeout_s from now); an invalid value is
    refused later, with the other parameters (requests.resolve)."""
    timeout = message.params.get("timeout_s") if isinstance(message.params, dict) else None
    valid = isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf")
    return time.monotonic() + timeout if valid else None
