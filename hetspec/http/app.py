"""An OpenAI-compatible HTTP front for an Engine: FastAPI routes over Engine.stream.

Each request is one engine request with its own zmq socket, driven from a
worker thread; the event loop only waits. A client that disconnects, mid-stream
or while waiting for a whole response, has its request cancelled
(Engine.cancel), so the engine moves on to the next one within a round.

Every answer that is not a completion is an error in OpenAI's shape, whatever
went wrong: a bad body (400), an unknown route (404), a body too large (413),
an engine that refuses or fails the request (400, 500, 503), or a fault of
this server itself (500).
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time
import traceback

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hetspec.core.errors import (
    EngineBusyError,
    EngineDeadError,
    HetspecError,
    InternalError,
    RequestAbortedError,
    RequestError,
)
from hetspec.http import protocol
from hetspec.http.metrics import Metrics
from hetspec.http.protocol import ChatCompletionRequest, CompletionRequest, HTTPError

DISCONNECT_POLL_S = 0.25
MAX_BODY_BYTES = 16 * 2**20


def build_app(engine, model: str, api_key: str | None = None) -> FastAPI:
    """The ASGI app serving `engine` as `model`; with api_key, /v1 needs `Authorization: Bearer KEY`."""
    api = OpenAIServer(engine, model, api_key)
    app = FastAPI(title="hetspec", description="OpenAI-compatible API of a hetspec engine")
    app.add_middleware(BoundedBody)
    app.add_exception_handler(HTTPError, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _starlette)
    app.add_exception_handler(Exception, _fault)
    app.add_api_route("/health", api.health, methods=["GET"])
    app.add_api_route("/metrics", api.prometheus, methods=["GET"])
    key = [Depends(api.authorize)]
    app.add_api_route("/v1/models", api.models, methods=["GET"], dependencies=key)
    app.add_api_route("/v1/chat/completions", api.chat, methods=["POST"], dependencies=key)
    app.add_api_route("/v1/completions", api.completions, methods=["POST"], dependencies=key)
    return app


async def _http_error(_, exc: HTTPError):
    return _answer(exc)


async def _invalid(_, exc: RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return _answer(HTTPError(400, f"invalid request: {where or 'body'}: {first.get('msg', exc)}", where))


async def _starlette(_, exc: StarletteHTTPException):   # unknown route or method, a body that is no JSON
    return _answer(HTTPError(exc.status_code, str(exc.detail)))


async def _fault(_, exc: Exception):                     # a fault of this server: logged, answered
    traceback.print_exception(exc)
    return _answer(HTTPError(500, f"the server failed on this request ({type(exc).__name__}: {exc})"))


class OpenAIServer:
    """The routes: each HTTP request is one engine request (Engine.stream)."""

    def __init__(self, engine, model: str, api_key: str | None):
        self.engine, self.model, self.api_key = engine, model, api_key
        self.metrics = Metrics(model)
        server = engine.info.get("config", {}).get("server", {})
        self.max_new_tokens = server.get("max_new_tokens") or server.get("max_context", 4096)

    def authorize(self, request: Request) -> None:
        if not self.api_key:                 # None or "": no key needed
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(errors="replace"), f"Bearer {self.api_key}".encode()):
            raise HTTPError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", code="invalid_api_key")

    def health(self):
        if why := self.engine.restarting():
            return JSONResponse({"status": "restarting", "reason": why}, status_code=503)
        try:
            info = self.engine.get_info(timeout_s=10)
        except HetspecError as exc:
            info = {"dead": str(exc)}
        if info.get("dead"):
            return JSONResponse({"status": "dead", "reason": info["dead"]}, status_code=503)
        draft = info.get("workers", {}).get("draft", {})
        if draft.get("state") == "failed":   # serving, target-only
            return {"status": "degraded", "reason": draft.get("failure")}
        return {"status": "ok"}

    def prometheus(self):
        try:
            info = self.engine.get_info(timeout_s=10)
        except HetspecError:
            info = None
        return Response(self.metrics.exposition(info), media_type="text/plain; version=0.0.4; charset=utf-8")

    def models(self):
        return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "hetspec"}]}

    async def chat(self, body: ChatCompletionRequest, request: Request):
        body.check(self.model)
        return await self._complete("chat", body, request, prompt=None, messages=[m.as_dict() for m in body.messages])

    async def completions(self, body: CompletionRequest, request: Request):
        body.check(self.model)
        return await self._complete("text", body, request, prompt=body.single_prompt(), messages=None)

    async def _complete(self, kind: str, body, request: Request, prompt, messages):
        started, limit = time.perf_counter(), body.limit()
        try:
            params = body.params(self.max_new_tokens if limit is None else limit)
            stream = self.engine.stream(prompt, messages=messages, params=params)
        except HetspecError as exc:
            raise _error(exc) from None
        rid = protocol.completion_id(kind)
        if body.stream:                      # a request the engine refuses is a 400, before the stream starts
            try:
                piece = await anyio.to_thread.run_sync(_next, stream)
            except HetspecError as exc:
                raise _error(exc) from None
            return EventSourceResponse(self._events(kind, rid, body, stream, started, piece), ping=15)
        collected = asyncio.ensure_future(anyio.to_thread.run_sync(_drain, stream))
        cancelled = False
        while not collected.done():          # a client gone before the answer cancels its request, once
            await asyncio.wait([collected], timeout=DISCONNECT_POLL_S)
            if not (collected.done() or cancelled) and await request.is_disconnected():
                self.engine.cancel(stream.request_id)
                cancelled = True
        result, first = await collected
        self.metrics.observe(result, time.perf_counter() - started, first and first - started)
        return protocol.response(kind, rid, self.model, result)

    async def _events(self, kind: str, rid: str, body, stream, started: float, piece: str | None):
        """Server-sent events: chunks, then (if asked) usage, then [DONE]. Leaving early
        (the client disconnected) cancels the request."""
        first, usage, model = None, body.include_usage, self.model
        try:
            yield json.dumps(protocol.chunk(kind, rid, model, first=True, include_usage=usage))
            while piece is not None:
                first = first or time.perf_counter()
                yield json.dumps(protocol.chunk(kind, rid, model, piece, include_usage=usage))
                piece = await anyio.to_thread.run_sync(_next, stream, abandon_on_cancel=True)
            result = stream.result
            self.metrics.observe(result, time.perf_counter() - started, first and first - started)
            final = protocol.chunk(kind, rid, model, finish=protocol.FINISH_REASONS.get(result.finish_reason),
                                   include_usage=usage)
            yield json.dumps({**final, "hetspec": result.stats})
            if usage:
                yield json.dumps(protocol.usage_chunk(kind, rid, model, result))
            yield "[DONE]"
        except HetspecError as exc:          # after the first event the status is sent: report in the stream
            yield json.dumps(_error(exc).body())
        except Exception as exc:  # noqa: BLE001 - this stream's fault boundary: logged, reported in the stream
            traceback.print_exception(exc)
            yield json.dumps(HTTPError(500, f"the server failed on this request ({type(exc).__name__})").body())
        finally:
            if stream.result is None:
                self.engine.cancel(stream.request_id)


class BoundedBody:
    """ASGI middleware: a body over MAX_BODY_BYTES is a 413, refused by its length or,
    sent without one, once that much has arrived (the engine's messages are bounded
    too, and reading a huge body must not take the server's memory)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) <= MAX_BODY_BYTES:
                return await self.app(scope, receive, send)
            return await _answer(HTTPError(413, f"the body's length is {length[:20].decode(errors='replace')!r}; "
                                                f"this server takes at most {MAX_BODY_BYTES} bytes"))(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None                  # the client left
            body, more = body + message.get("body", b""), message.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                return await _answer(HTTPError(413, f"the body is over {MAX_BODY_BYTES} bytes, the most this server "
                                                    "takes"))(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()       # later: a disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def _answer(error: HTTPError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _next(stream):
    """The stream's next text piece, or None once it has finished (in a worker thread)."""
    try:
        return next(stream)
    except StopIteration:
        return None


def _drain(stream):
    """(the Result, when the first text arrived) of a whole request (in a worker thread)."""
    first = None
    try:
        for _ in stream:
            first = first or time.perf_counter()
    except HetspecError as exc:
        raise _error(exc) from None
    return stream.result, first


def _error(exc: HetspecError) -> HTTPError:
    if isinstance(exc, EngineBusyError):
        return HTTPError(503, str(exc), code="engine_busy")
    if isinstance(exc, RequestError):
        return HTTPError(400, str(exc))
    if isinstance(exc, InternalError):
        return HTTPError(500, str(exc), code="internal_error")
    if isinstance(exc, EngineDeadError):
        return HTTPError(503, f"the engine is dead: {exc}", code="engine_dead")
    if isinstance(exc, RequestAbortedError):
        return HTTPError(503, str(exc), code="request_aborted")
    return HTTPError(503, str(exc))
