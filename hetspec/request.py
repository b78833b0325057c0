"""A generation request: its parameters, checked once, with errors that name the problem."""
from __future__ import annotations

import math
import numbers

from hetspec.config import MODES
from hetspec.errors import RequestError
from ipc.messages import GenerateRequest


def build_request(request_id: int, prompt=None, *, messages=None, max_new_tokens=128, temperature=0.0,
                  top_p=1.0, top_k=0, seed=None, stop=None, mode="duodec", gamma=None,
                  sequences=None, cache_prompt=True) -> GenerateRequest:
    """Validate the arguments of Engine.generate and pack them as a message."""
    if (prompt is None) == (messages is None):
        raise RequestError("give exactly one of prompt or messages")
    if prompt is not None:
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("prompt is empty")
        elif isinstance(prompt, (list, tuple)):
            if not prompt:
                raise RequestError("prompt is empty")
            if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in prompt):
                raise RequestError("a token-id prompt must be a list of non-negative integers")
            prompt = [int(t) for t in prompt]
        else:
            raise RequestError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
    if messages is not None and (not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        raise RequestError("messages must be a non-empty list of {'role': str, 'content': str}")
    if not _is_int(max_new_tokens) or max_new_tokens <= 0:
        raise RequestError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) or not 0 <= temperature < math.inf:
        raise RequestError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {top_p!r}")
    if not _is_int(top_k) or top_k < 0:
        raise RequestError(f"top_k must be an integer >= 0 (0 disables it), got {top_k!r}")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise RequestError(f"seed must be a non-negative integer or None, got {seed!r}")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop)):
        raise RequestError("stop must be a non-empty string or a list of non-empty strings")
    if mode not in MODES:
        raise RequestError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    if gamma is not None and (not _is_int(gamma) or gamma < 1):
        raise RequestError(f"gamma must be a positive integer or None, got {gamma!r}")
    if sequences is not None and sequences != "dynamic" and (not _is_int(sequences) or sequences < 1):
        raise RequestError(f"sequences must be 'dynamic', a positive integer or None, got {sequences!r}")
    if not isinstance(cache_prompt, bool):
        raise RequestError(f"cache_prompt must be true or false, got {cache_prompt!r}")
    return GenerateRequest(request_id=request_id, prompt=prompt, messages=messages,
                           max_new_tokens=int(max_new_tokens), temperature=float(temperature), top_p=float(top_p),
                           top_k=int(top_k), seed=seed, stop=list(stop) if stop else None, mode=mode,
                           gamma=gamma, sequences=sequences, cache_prompt=cache_prompt)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
