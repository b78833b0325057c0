"""The scheduler's side of its clients: one ROUTER socket, the queue (the admitted requests
are in slots.py), cancels, deadlines, and how requests ended. A client whose send fails is
gone: its request is cancelled."""
from __future__ import annotations

import secrets
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, field

from hetspec.core.errors import RequestError
from hetspec.core.params import SamplingParams, check_prompt
from hetspec.ipc.channel import Router
from hetspec.ipc.codec import Malformed
from hetspec.ipc.messages import CancelRequest, Finished, GenerateRequest, RequestFailed, TokensEvent

MAX_EARLY_CANCELS = 1024


@dataclass
class Pending:
    """A client's request, its parameters checked (the one place they are, off the wire)."""
    identity: bytes
    message: GenerateRequest
    params: SamplingParams
    retried: bool = False          # run again once already: its target died before its first token
    arrived: float = field(default_factory=time.monotonic)

    @property
    def id(self) -> int:
        return self.message.request_id

    @property
    def deadline(self) -> float | None:
        return None if self.params.timeout_s is None else self.arrived + self.params.timeout_s

    @classmethod
    def checked(cls, identity: bytes, message: GenerateRequest) -> Pending:
        """RequestError names what is wrong with the request's prompt or parameters."""
        check_prompt(message.prompt, message.messages)
        return cls(identity, message, SamplingParams.make(message.params))


class Clients:
    def __init__(self, context, endpoint: str, max_queue: int, api_key: str | None):
        self.router = Router(context, endpoint)
        self.endpoint = self.router.endpoint
        self.max_queue, self.api_key = max_queue, api_key
        self.queue: deque[Pending] = deque()
        self.cancelled: set[int] = set()         # ids asked to stop (CancelRequest): admitted, or not seen yet
        self.counts = Counter()                  # requests by how they ended: completed, cancelled, timeout...

    def send(self, identity: bytes, message) -> bool:
        """False if that client is gone."""
        return self.router.send(identity, message)

    def read(self, timeout_ms: int, running: int) -> list[tuple[bytes, object]]:
        """Queue requests and apply cancels; answer what is malformed, unauthorized or over
        max_queue (queued and `running`); return the rest (info, stop) for the scheduler."""
        if not self.router.waiting(timeout_ms):
            return []
        others = []
        while (item := self.router.recv_nowait()) is not None:
            try:
                self._take(*item, others, running)
            except Exception as exc:  # noqa: BLE001 - this message's fault boundary: logged, answered
                traceback.print_exc()
                rid = getattr(item[1], "request_id", -1)
                self.send(item[0], RequestFailed(rid if isinstance(rid, int) else -1, "internal",
                                                 f"the engine failed on this message ({type(exc).__name__})"))
        return others

    def _take(self, identity: bytes, message, others: list, running: int) -> None:
        if isinstance(message, Malformed):
            self.send(identity, RequestFailed(message.request_id, "request", str(message)))
        elif not self._authorized(message):
            rid = getattr(message, "request_id", -1)
            self.send(identity, RequestFailed(rid, "auth", "this engine needs its API key (the token)"))
        elif isinstance(message, GenerateRequest) and message.request_id in self.cancelled:
            self.cancelled.discard(message.request_id)    # cancelled before it arrived
            self.finish_early(identity, message.request_id, "cancelled")
        elif isinstance(message, GenerateRequest) and len(self.queue) + running > self.max_queue:
            self.counts["busy"] += 1   # (when idle, the first in the queue is admitted at once)
            self.send(identity, RequestFailed(message.request_id, "busy", "the engine is busy: "
                                              f"{len(self.queue)} requests are waiting ([server] max_queue)"))
        elif isinstance(message, GenerateRequest):
            self._enqueue(identity, message)
        elif isinstance(message, CancelRequest):
            self._cancel(message.request_id)
        else:
            others.append((identity, message))

    def _enqueue(self, identity: bytes, message: GenerateRequest) -> None:
        try:
            self.queue.append(Pending.checked(identity, message))
        except RequestError as exc:
            self.counts["refused"] += 1
            self.send(identity, RequestFailed(message.request_id, "request", str(exc)))

    def admit(self) -> Pending | None:
        """The next queued request whose client is still there, now admitted."""
        while self.queue:
            pending = self.queue.popleft()
            if self.send(pending.identity, TokensEvent(pending.id, [], "")):   # an empty event: is anyone there?
                return pending
            self.counts["cancelled"] += 1
        return None

    def done(self, pending: Pending) -> None:
        """An admitted request ended (however): a cancel that came too late is forgotten."""
        self.cancelled.discard(pending.id)

    def must_stop(self, pending: Pending) -> str | None:
        """Why an admitted request must end now, if it must: "cancelled" or "timeout"."""
        if pending.id in self.cancelled:
            return "cancelled"
        if pending.deadline is not None and time.monotonic() >= pending.deadline:
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

    def refuse_all(self, running: list[Pending], message: str) -> None:
        """Never leave a client waiting (the engine is stopping): the running ones and the queue."""
        for pending in [*running, *self.queue]:
            self.send(pending.identity, RequestFailed(pending.id, "dead", message))
        self.queue.clear()

    def _cancel(self, rid: int) -> None:
        """Queued: ends now; admitted: at its next step; not seen yet: as it arrives."""
        for pending in list(self.queue):
            if pending.id == rid:
                self.queue.remove(pending)
                self.finish_early(pending.identity, rid, "cancelled")
                return
        if len(self.cancelled) > MAX_EARLY_CANCELS:   # ids of requests that finished before their cancel
            self.cancelled.clear()
        self.cancelled.add(rid)

    def _authorized(self, message) -> bool:
        token = str(getattr(message, "token", "")).encode("utf-8", "surrogatepass")   # (any text: it is compared)
        return not self.api_key or secrets.compare_digest(token, self.api_key.encode())

    def close(self) -> None:
        self.router.close()

