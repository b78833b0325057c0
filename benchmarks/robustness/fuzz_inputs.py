"""Hypothesis strategies for hostile input, one per surface of an engine (fuzz.py): near-valid
requests with a field pushed past a bound (they reach the deepest checks), arbitrary JSON, raw bytes."""
from __future__ import annotations

import json
import math

from hypothesis import strategies as st

from hetspec.core.params import FIELDS, Mode
from hetspec.ipc import codec, messages

HOSTILE_TEXT = ["\ud800 x", "\udfff", "a\x00b", "\x00", "", " ", "\n" * 50, "é漢字🙂", "\u202eevil", "a" * 3000,
                "<|im_start|>", "{{ raise }}", "\\ud800", "%s%n", "null"]
EDGE_NUMBERS = [0, -1, 1, 2, 7, 31, 32, 33, 255, 256, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**12,
                10**100, -(10**100), 0.0, -0.0, 0.5, 0.7, 1.0, 1.5, 2.0, 1e-300, 1e308, -1e308, math.nan, math.inf,
                -math.inf, True, False]
TAGS = codec.TAG_OF


def text() -> st.SearchStrategy[str]:
    """Any unicode, lone surrogates and NUL included, and a few strings known to bite."""
    return st.one_of(st.text(alphabet=st.characters(exclude_categories=()), max_size=40),
                     st.sampled_from(HOSTILE_TEXT), st.text(max_size=12))


def plain_text(min_size: int = 0) -> st.SearchStrategy[str]:
    """Text a tokenizer takes (no lone surrogates), NUL and all."""
    return st.text(min_size=min_size, max_size=30)


def numbers() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(EDGE_NUMBERS), st.integers(), st.integers(-(2**70), 2**70),
                     st.floats(allow_nan=True, allow_infinity=True))


def json_values(max_leaves: int = 12) -> st.SearchStrategy:
    """Arbitrary JSON-shaped values (NaN and the infinities too: Python's json reads them)."""
    return st.recursive(st.one_of(st.none(), st.booleans(), numbers(), text()),
                        lambda children: st.one_of(st.lists(children, max_size=4),
                                                   st.dictionaries(text(), children, max_size=4)),
                        max_leaves=max_leaves)


@st.composite
def some_fields(draw, valid: dict, hostile: bool = True) -> dict:
    """Some of these fields with sensible values; hostile: then one or two replaced by anything, or an unknown field
    added (wrong in one place only, an input reaches the check of that place)."""
    fields = {name: draw(valid[name]) for name in draw(st.lists(st.sampled_from(sorted(valid)), unique=True))}
    if hostile and draw(st.booleans()):
        fields[draw(text())] = draw(json_values(2))
    elif hostile:
        for name in draw(st.lists(st.sampled_from(sorted(valid)), min_size=1, max_size=2, unique=True)):
            fields[name] = draw(st.one_of(numbers(), text(), json_values(3)))
    return fields


def good_prompts() -> st.SearchStrategy:
    return st.one_of(plain_text(1), st.lists(st.integers(0, 400), min_size=1, max_size=30))


def prompts() -> st.SearchStrategy:
    """Mostly a prompt the engine takes; else invalid text, ids outside the vocabulary, or anything."""
    good = good_prompts()
    return st.one_of(good, good, good, text(), st.lists(numbers(), max_size=5), st.just([]), json_values(4))


def chat_messages() -> st.SearchStrategy:
    role = st.sampled_from(["user", "system", "assistant"])
    maybe = lambda value: st.one_of(value, value, value, json_values(4))     # mostly sensible, sometimes anything
    message = st.fixed_dictionaries({"role": maybe(role), "content": maybe(text())},
                                    optional={"name": text(), "extra": json_values(3)})
    return st.one_of(st.lists(st.fixed_dictionaries({"role": role, "content": plain_text()}), min_size=1, max_size=3),
                     st.lists(message, min_size=1, max_size=3), json_values(4))


SAMPLING = {   # each SamplingParams field, with values the engine takes
    "max_new_tokens": st.integers(1, 40), "temperature": st.sampled_from([0, 0, 0.7, 1.0, 1e-9, 100]),
    "top_p": st.sampled_from([1.0, 0.9, 0.01]), "top_k": st.sampled_from([0, 1, 5, 2**31 - 1]),
    "seed": st.one_of(st.none(), st.integers(0, 2**63 - 1)), "stop": st.lists(plain_text(1), max_size=3),
    "mode": st.sampled_from(Mode.values()), "gamma": st.one_of(st.none(), st.integers(1, 8)),
    "sequences": st.one_of(st.none(), st.just("dynamic"), st.integers(1, 4)), "cache_prompt": st.booleans(),
    "timeout_s": st.one_of(st.none(), st.sampled_from([0.001, 0.05, 5.0, 86400.0])),
    "speculation": st.sampled_from([None, "auto", "always"]),
}
assert set(SAMPLING) == FIELDS, "every SamplingParams field is fuzzed"

# an OpenAI request's fields the server takes (a good request leaves out what is refused) ...
HTTP_FIELDS = {"max_tokens": st.integers(1, 40), "model": st.just("fuzz"),
               "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "stream": st.booleans(),
               **{name: SAMPLING[name] for name in ("temperature", "top_p", "top_k", "stop", "seed", "mode",
                                                    "timeout_s", "speculation")}}
# ... and, to push at, other values, hetspec's extras and the options it refuses
HTTP_HOSTILE_FIELDS = {**HTTP_FIELDS, "model": st.sampled_from(["fuzz", "gpt-4"]),
                       "stop": st.one_of(plain_text(1), SAMPLING["stop"]), "max_completion_tokens": st.integers(1, 40),
                       "n": st.sampled_from([1, 2]), "presence_penalty": st.sampled_from([0, 0.5]),
                       "logprobs": st.booleans(), "echo": st.booleans(), "gamma": SAMPLING["gamma"],
                       "sequences": SAMPLING["sequences"]}
# what an HTTP header value can carry (h11 refuses the rest client-side)
HEADER_TEXT = st.text(alphabet=st.one_of(st.characters(min_codepoint=33, max_codepoint=126),
                                         st.characters(min_codepoint=0xA1, max_codepoint=0xFF)),
                      min_size=1, max_size=30)
COMPLETIONS = ["/v1/completions", "/v1/chat/completions"]


@st.composite
def http_requests(draw) -> dict:
    """A completion or chat request most of the time, else another endpoint, an unknown route or method, a body
    that is not JSON."""
    kind = draw(st.sampled_from(["completion", "completion", "chat", "chat", "json", "raw", "get", "route"]))
    auth = draw(st.sampled_from(["good"] * 6 + ["none", "bearer", "text"]))   # (one_of would weigh them evenly)
    if auth in ("bearer", "text"):
        auth = ("Bearer " if auth == "bearer" else "") + draw(HEADER_TEXT)
    content_type = draw(st.sampled_from(["application/json"] * 5 + ["text/plain", "json; charset=latin-1", "text"]))
    headers = {"content-type": draw(HEADER_TEXT) if content_type == "text" else content_type}
    method, path, body = "POST", draw(st.sampled_from(COMPLETIONS)), b""
    if kind in ("completion", "chat"):
        hostile = draw(st.booleans())
        fields = draw(some_fields(HTTP_HOSTILE_FIELDS if hostile else HTTP_FIELDS, hostile))
        path = COMPLETIONS[kind == "chat"]
        if kind == "chat" and hostile:
            fields.update(draw(st.fixed_dictionaries({}, optional={"messages": chat_messages()})))
        if kind == "chat":
            fields.setdefault("messages", [{"role": "user", "content": draw(plain_text())}])
        else:
            fields.setdefault("prompt", draw(prompts() if hostile else good_prompts()))
        body = json.dumps(fields).encode()
    elif kind in ("json", "raw"):
        body = json.dumps(draw(json_values())).encode() if kind == "json" else draw(
            st.one_of(st.binary(max_size=200), st.just(b"[" * 50000), st.just(b'{"prompt": "\xff\xfe"}')))
    elif kind == "get":
        method, path = "GET", draw(st.sampled_from(["/v1/models", "/health", "/metrics"]))
    else:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]))
        path = "/" + draw(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126,
                                                         exclude_characters="#?%"), max_size=30))
    return {"method": method, "path": path, "auth": auth, "headers": headers, "body": body}


@st.composite
def client_calls(draw) -> dict:
    """Engine.generate / stream arguments: a request the engine takes, or one wrong somewhere."""
    call = {"stream": draw(st.booleans())}
    if draw(st.booleans()):                   # a good one: it reaches the engine, and decodes
        if draw(st.booleans()):
            call["prompt"], call["messages"] = draw(good_prompts()), None
        else:
            call["prompt"], call["messages"] = None, [{"role": "user", "content": draw(plain_text())}]
        call["params"] = draw(st.one_of(st.none(), some_fields(SAMPLING, False)))
        return {**call, "overrides": draw(some_fields(SAMPLING, False))}
    choice = draw(st.sampled_from(["prompt", "messages", "both", "neither"]))
    call["prompt"] = draw(prompts()) if choice in ("prompt", "both") else None
    call["messages"] = draw(chat_messages()) if choice in ("messages", "both") else None
    call["params"] = draw(st.one_of(st.none(), some_fields(SAMPLING), json_values(3)))
    overrides = draw(some_fields(SAMPLING))
    return {**call, "overrides": {k: v for k, v in overrides.items() if k not in ("prompt", "messages", "params")}}


@st.composite
def wire_frames(draw, key: str) -> list[bytes]:
    """Frames any process could send the scheduler: a client message with hostile fields, any message type with
    any JSON, or bytes; `key` is the engine's API key, so that some reach past the check."""
    kind = draw(st.sampled_from(["generate", "generate", "generate", "client", "any", "raw"]))
    if kind == "raw":
        return draw(st.lists(st.binary(max_size=40), min_size=1, max_size=4))
    if kind == "any":
        return [TAGS[draw(st.sampled_from(sorted(TAGS, key=lambda c: c.__name__)))],
                json.dumps(draw(json_values())).encode()]
    token = draw(st.one_of(st.just(key), st.just(key), st.just(""), text()))
    if kind == "client":
        cls = draw(st.sampled_from([messages.InfoRequest, messages.CancelRequest]))
        fields = {"token": token} if cls is messages.InfoRequest else {"request_id": draw(numbers()), "token": token}
        return [TAGS[cls], json.dumps(fields).encode()]
    if draw(st.booleans()):                   # a good one: it reaches the engine, and decodes
        fields = {"request_id": draw(st.integers(0, 2**62)), "token": key, "params": draw(some_fields(SAMPLING, False)),
                  "prompt": draw(good_prompts()), "messages": None}
        return [TAGS[messages.GenerateRequest], json.dumps(fields).encode()]
    fields = {"request_id": draw(st.one_of(st.integers(0, 2**62), numbers())), "token": token,
              "params": draw(st.one_of(some_fields(SAMPLING), json_values(3)))}
    choice = draw(st.sampled_from(["prompt", "prompt", "messages", "neither"]))
    fields["prompt"] = draw(prompts()) if choice == "prompt" else None
    fields["messages"] = draw(chat_messages()) if choice == "messages" else None
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2)):
        fields.pop(name, None)
    if draw(st.booleans()):
        fields[draw(text())] = draw(json_values(2))
    return [TAGS[messages.GenerateRequest], json.dumps(fields).encode()]


def config_dicts() -> st.SearchStrategy[dict]:
    from hetspec.config import _SECTIONS

    models = st.sampled_from(["builtin:smollm2", "random:seed=1", "random:vocab=big", "random:vocab=99999999999999",
                              "random:hidden=7,heads=2", "/nonexistent.gguf", "x/y", "~nobody/m", "a\x00b", ""])
    values = st.one_of(numbers(), text(), models, st.booleans(), st.sampled_from(["auto", "dynamic", "tcp", "cuda:0"]),
                       st.lists(st.one_of(st.integers(-2, 4), numbers()), max_size=3), json_values(3))
    sections = {}
    for name, cls in _SECTIONS.items():
        keys = st.sampled_from([f for f in cls.__dataclass_fields__ if f != "BOUNDS"])
        sections[name] = st.dictionaries(st.one_of(keys, keys, text()), values, max_size=4)
    return st.one_of(st.fixed_dictionaries({}, optional=sections),
                     st.dictionaries(text(), json_values(4), max_size=3), json_values(4))


def toml_texts() -> st.SearchStrategy[str]:
    """TOML text: a near-valid config written out, or any text at all."""
    return st.one_of(config_dicts().map(_toml), text(), st.just("[draft]\nthreads = inf\n"),
                     st.just("[server]\nmax_context = nan\n"), st.just("[draft]\n" + "a = [" * 3000))


def _toml(value) -> str:
    """A small TOML writer: tables of scalars and arrays; what TOML cannot say is left out."""
    if not isinstance(value, dict):
        return f"x = {_toml_scalar(value)}\n"
    lines = []
    for section, keys in value.items():
        if isinstance(keys, dict):
            lines.append(f"[{json.dumps(section)}]")
            lines += [f"{json.dumps(key)} = {scalar}" for key, item in keys.items()
                      if (scalar := _toml_scalar(item)) is not None]
    return "\n".join(lines) + "\n"


def _toml_scalar(value) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        items = [_toml_scalar(v) for v in value]
        return None if None in items else "[" + ", ".join(items) + "]"
    return None
