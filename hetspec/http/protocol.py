"""OpenAI's request and response shapes, and how they map onto hetspec's.

Requests are pydantic models that take OpenAI's fields and, as extra fields,
hetspec's own options (mode, gamma, sequences, top_k, timeout_s, speculation), the way vLLM takes its
extras. Whatever hetspec cannot honour (n > 1, logprobs, penalties, echo) is
refused with a 400 that names it, never ignored silently.
"""
from __future__ import annotations

import time
import typing
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hetspec.core.params import SamplingParams, show

# OpenAI's finish reasons: a request cut off by its deadline was cut off by a limit, like one cut by max_tokens
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "timeout": "length"}


class HTTPError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    TYPES: typing.ClassVar[dict[int, str]] = {400: "invalid_request_error", 401: "authentication_error",
                                              404: "invalid_request_error", 405: "invalid_request_error",
                                              413: "invalid_request_error", 503: "service_unavailable_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        """The error's JSON; its text never holds what UTF-8 cannot encode (a lone
        surrogate quoted from a request), so that it always reaches the client."""
        return {"error": {"message": _encodable(self.message), "type": self.TYPES.get(self.status, "server_error"),
                          "param": _encodable(self.param), "code": self.code}}


def _encodable(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    """What chat and text completions share."""
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None       # OpenAI's default is 1.0
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # hetspec's own options, as extra body fields
    mode: str | None = None
    gamma: int | None = None
    sequences: int | str | None = None
    top_k: int | None = None
    timeout_s: float | None = None
    speculation: str | None = None

    def check(self, served_model: str) -> None:
        if self.model is not None and self.model != served_model:
            raise HTTPError(400, f"the model {show(self.model)} is not served here; this server serves "
                                 f"{served_model!r}", "model", "model_not_found")
        if self.n != 1:
            raise HTTPError(400, "n must be 1: hetspec returns one choice per request", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise HTTPError(400, f"{name} is not supported (it would change the target's distribution)", name)

    def params(self, max_new_tokens: int) -> SamplingParams:
        """The request as SamplingParams (a RequestError names a bad value)."""
        values = dict(max_new_tokens=max_new_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                      top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed, stop=self.stop or ())
        for name in ("mode", "gamma", "sequences", "top_k", "timeout_s", "speculation"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        return SamplingParams(**values)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: str
    content: str | list[ContentPart]

    def as_dict(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": self.role, "content": content}


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def check(self, served_model: str) -> None:
        super().check(served_model)
        if self.logprobs or self.top_logprobs:
            raise HTTPError(400, "logprobs are not supported", "logprobs")

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16            # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def check(self, served_model: str) -> None:
        super().check(served_model)
        for name, refused in (("logprobs", self.logprobs is not None), ("echo", self.echo),
                              ("suffix", self.suffix is not None), ("best_of", (self.best_of or 1) != 1)):
            if refused:
                raise HTTPError(400, f"{name} is not supported", name)
        if self._batched() and len(self.prompt) != 1:
            raise HTTPError(400, "one prompt per request: a batch of prompts is not supported", "prompt")

    def _batched(self) -> bool:
        return isinstance(self.prompt, list) and bool(self.prompt) and isinstance(self.prompt[0], (str, list))

    def single_prompt(self) -> str | list[int]:
        return self.prompt[0] if self._batched() else self.prompt

    def limit(self) -> int | None:
        return self.max_tokens


def completion_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def usage(result) -> dict:
    prompt = int(result.stats.get("prompt_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": len(result.token_ids),
            "total_tokens": prompt + len(result.token_ids)}


def response(kind: str, rid: str, model: str, result) -> dict:
    """A whole (non-streamed) chat.completion or text_completion."""
    finish = FINISH_REASONS.get(result.finish_reason, result.finish_reason)
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice], "usage": usage(result),
            "hetspec": result.stats}


def chunk(kind: str, rid: str, model: str, text: str | None = None, finish: str | None = None,
          first: bool = False, include_usage: bool = False) -> dict:
    """One streamed chunk: text, or (finish given) the closing one."""
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    body = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}
    if include_usage:
        body["usage"] = None             # OpenAI: null on every chunk but the last, which has only usage
    return body


def usage_chunk(kind: str, rid: str, model: str, result) -> dict:
    return {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [], "usage": usage(result)}
