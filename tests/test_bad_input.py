"""Bad input: every mistake gives a clear hetspec error naming what is wrong, and never
takes a running engine down (a valid request after it, on the same engine, still gives
the same output as before).

Python API: RequestError for a bad request (checked by the client, and checked again by
the scheduler for clients that bypass hetspec.client), ConfigError from launch() before
any process starts, EngineStartError when the workers load but cannot work together.
The CLI's answers to bad input: test_bad_cli.py.

One engine (tiny random models, max_context 64) serves the whole module.
"""
from __future__ import annotations

import math
import re
import subprocess
import time

import pytest
import zmq

import hetspec
import hetspec.client
from hetspec import ConfigError, EngineStartError, RequestError
from hetspec.ipc.channel import Channel
from hetspec.ipc.codec import encode
from hetspec.ipc.messages import Finished, GenerateRequest, RequestFailed, Shutdown, TokensEvent

DRAFT = "random:seed=1"
TARGET = "random:seed=0"
VOCAB = 320                      # the random models' vocabulary
MAX_CONTEXT = 64


def config(**sections) -> dict:
    """The fast random-model config, with some sections' keys added or replaced."""
    base = {"draft": {"backend": "torch", "model": DRAFT}, "target": {"model": TARGET}, "decoding": {"gamma": 4}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


@pytest.fixture(scope="module")
def engine():
    with hetspec.launch(config(server={"max_context": MAX_CONTEXT})) as e:
        yield e


@pytest.fixture(scope="module")
def reference(engine) -> list[int]:
    """A valid request's greedy output, before any bad input was sent."""
    result = engine.generate("a valid prompt", max_new_tokens=8)
    assert len(result.token_ids) == 8
    return result.token_ids


def assert_still_serves(engine, reference) -> None:
    assert engine.generate("a valid prompt", max_new_tokens=8).token_ids == reference


# ---- bad requests through the Python API -------------------------------------------------

def hello(**kwargs) -> dict:
    return {"prompt": "hello", **kwargs}


BAD_REQUESTS = {
    # id: (generate() keyword arguments but max_new_tokens, pattern the message must match)
    "empty-string-prompt": ({"prompt": ""}, r"prompt is empty"),
    "empty-token-prompt": ({"prompt": []}, r"prompt is empty"),
    "prompt-and-messages": ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, r"prompt or messages"),
    "no-prompt": ({}, r"prompt or messages"),
    "prompt-wrong-type": ({"prompt": 42}, r"prompt must be a string or a list of token ids"),
    "prompt-longer-than-context-text": ({"prompt": "x" * 100}, rf"100 tokens.*{MAX_CONTEXT}"),
    "prompt-longer-than-context-ids": ({"prompt": [7] * 100}, rf"100 tokens.*{MAX_CONTEXT}"),
    "prompt-exactly-context": ({"prompt": [7] * MAX_CONTEXT}, rf"{MAX_CONTEXT} tokens.*context holds {MAX_CONTEXT}"),
    "max-new-tokens-zero": (hello(max_new_tokens=0), r"max_new_tokens.*got 0"),
    "unknown-keyword": (hello(temprature=0.5), r"unknown parameter\(s\) 'temprature'; known: .*temperature"),
    "max-new-tokens-negative": (hello(max_new_tokens=-5), r"max_new_tokens.*got -5"),
    "max-new-tokens-float": (hello(max_new_tokens=2.5), r"max_new_tokens.*got 2\.5"),
    "temperature-negative": (hello(temperature=-0.5), r"temperature.*got -0\.5"),
    "temperature-nan": (hello(temperature=math.nan), r"temperature.*got nan"),
    "top-p-zero": (hello(top_p=0), r"top_p must be in \(0, 1\], got 0"),
    "top-p-above-one": (hello(top_p=1.5), r"top_p must be in \(0, 1\], got 1\.5"),
    "top-p-nan": (hello(top_p=math.nan), r"top_p.*got nan"),
    "top-k-negative": (hello(top_k=-1), r"top_k.*got -1"),
    "seed-negative": (hello(seed=-3), r"seed.*got -3"),
    "stop-empty-string": (hello(stop=[""]), r"stop must be"),
    "unknown-mode": (hello(mode="turbo"), r"unknown mode 'turbo'.*duodec"),
    "gamma-zero": (hello(gamma=0), r"gamma.*got 0"),
    "gamma-above-max": (hello(gamma=33), r"gamma 33 exceeds.*max_gamma = 32"),
    "sequences-above-max": (hello(sequences=5), r"sequences 5 exceeds.*max_sequences = 4"),
    "cache-prompt-not-bool": (hello(cache_prompt="no"), r"cache_prompt must be true or false, got 'no'"),
    "token-id-at-vocab-size": ({"prompt": [1, 2, VOCAB]}, rf"token id {VOCAB} is outside the vocabulary \(size {VOCAB}\)"),
    "token-id-far-outside": ({"prompt": [10**12]}, rf"token id {10**12} is outside the vocabulary"),
    "token-id-negative": ({"prompt": [5, -1]}, r"non-negative"),
    "messages-without-chat-template": ({"messages": [{"role": "user", "content": "hi"}]}, r"no chat template"),
    "messages-malformed": ({"messages": [{"role": "user"}]}, r"messages must be"),
    "prompt-lone-surrogate": ({"prompt": "\ud800 x"},
                              r"the prompt is not valid text: its character 0 is a lone surrogate \(U\+D800\)"),
    "message-lone-surrogate": ({"messages": [{"role": "user", "content": "ok \udfff"}]},
                               r"messages\[0\]\.content is not valid text: its character 3"),
    "stop-lone-surrogate": (hello(stop=["fine", "\ud800"]), r"stop string 1 is not valid text"),
    "params-not-a-dict": ({"prompt": "hi", "params": 5}, r"params must be a SamplingParams or a dict, got int"),
    "max-new-tokens-huge": (hello(max_new_tokens=10**12),
                            r"max_new_tokens must be an integer in 1\.\.2147483647, got 1000000000000"),
    "temperature-infinite": (hello(temperature=math.inf), r"temperature must be a number in \[0, 100\], got inf"),
    "temperature-huge-int": (hello(temperature=10**400), r"temperature.*got an integer of 1329 bits"),
    "top-k-huge": (hello(top_k=2**40), r"top_k must be an integer in 0\.\.2147483647"),
    "seed-past-64-bits": (hello(seed=2**64), r"seed must be an integer in 0\.\.9223372036854775807"),
    "gamma-huge": (hello(gamma=10**6), r"gamma must be an integer in 1\.\.1024"),
    "timeout-past-a-day": (hello(timeout_s=1e9), r"timeout_s must be a number of seconds in \(0, 86400\]"),
}


@pytest.mark.parametrize("kwargs, pattern", list(BAD_REQUESTS.values()), ids=list(BAD_REQUESTS))
def test_bad_request_names_the_problem_and_engine_keeps_serving(engine, reference, kwargs, pattern):
    kwargs = {"max_new_tokens": 8, **kwargs}
    with pytest.raises(RequestError, match=pattern):
        engine.generate(**kwargs)
    with pytest.raises(RequestError, match=pattern):          # streaming reports it the same way
        "".join(engine.stream(**kwargs))
    assert_still_serves(engine, reference)


def test_bad_request_errors_are_hetspec_errors_and_value_errors(engine):
    with pytest.raises(hetspec.HetspecError):
        engine.generate("hello", top_p=0)
    with pytest.raises(ValueError):                            # RequestError is also a ValueError
        engine.generate("hello", top_p=0)


def test_prompt_that_just_fits_the_context_is_capped_not_refused(engine, reference):
    result = engine.generate([7] * (MAX_CONTEXT - 1), max_new_tokens=10)
    assert len(result.token_ids) == 1                          # prompt + new tokens <= max_context
    assert result.finish_reason == "length"
    assert_still_serves(engine, reference)


def test_max_new_tokens_is_capped_by_the_engines_per_request_maximum(reference):
    """[server] max_new_tokens caps a request (as the context does): it ends at the cap with
    finish_reason "length", and its tokens are those an uncapped request starts with."""
    with hetspec.launch(config(server={"max_context": MAX_CONTEXT, "max_new_tokens": 5})) as capped:
        assert capped.info["config"]["server"]["max_new_tokens"] == 5
        result = capped.generate("a valid prompt", max_new_tokens=8)
    assert result.token_ids == reference[:5] and result.finish_reason == "length"


def test_many_bad_requests_in_a_row_then_a_good_one(engine, reference):
    for kwargs, _ in BAD_REQUESTS.values():
        with pytest.raises(RequestError):
            engine.generate(**{"max_new_tokens": 8, **kwargs})
    assert_still_serves(engine, reference)


# ---- bad requests that bypass hetspec.client: the scheduler checks again -------------------

def raw_exchange(endpoint: str, frames: list[bytes], timeout_s: float = 30.0):
    """Send raw frames to the scheduler, return its final answer (RequestFailed or Finished)."""
    context = zmq.Context()
    channel = Channel(context, endpoint, bind=False)
    try:
        channel.socket.send_multipart(frames)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = channel.recv(0.5)
            if isinstance(message, (RequestFailed, Finished)):
                return message
            assert message is None or isinstance(message, TokensEvent), message
        raise AssertionError(f"the scheduler did not answer within {timeout_s} s")
    finally:
        channel.socket.setsockopt(zmq.LINGER, 0)
        channel.close()
        context.term()


def raw_request(endpoint: str, **fields):
    """A GenerateRequest as any client could send it: parameters unchecked."""
    message, params = {"request_id": 77, "prompt": "hello", "messages": None}, {"max_new_tokens": 4}
    for key, value in fields.items():
        (message if key in message else params)[key] = value
    return raw_exchange(endpoint, encode(GenerateRequest(**message, params=params)))


RAW_BAD = {
    "empty-prompt": ({"prompt": ""}, r"prompt is empty"),
    "prompt-object": ({"prompt": {"a": 1}}, r"malformed GenerateRequest: prompt must be a string or a list"),
    "negative-token": ({"prompt": [1, -4]}, r"non-negative"),
    "token-outside-vocab": ({"prompt": [VOCAB + 1]}, rf"token id {VOCAB + 1} is outside the vocabulary"),
    "max-new-tokens-zero": ({"max_new_tokens": 0}, r"max_new_tokens"),
    "max-new-tokens-string": ({"max_new_tokens": "8"}, r"max_new_tokens"),
    "temperature-negative": ({"temperature": -1.0}, r"temperature"),
    "top-p-zero": ({"top_p": 0.0}, r"top_p"),
    "top-p-above-one": ({"top_p": 1.5}, r"top_p"),
    "unknown-mode": ({"mode": "turbo"}, r"unknown mode 'turbo'"),
    "unknown-parameter": ({"tempreature": 0.5}, r"unknown parameter\(s\) 'tempreature'; known: .*temperature"),
    "messages-not-a-list": ({"prompt": None, "messages": "hi"}, r"messages must be"),
    "prompt-lone-surrogate": ({"prompt": "\ud800 x"}, r"the prompt is not valid text: its character 0"),
    "temperature-nan": ({"temperature": math.nan}, r"temperature.*got nan"),
    "seed-past-64-bits": ({"seed": 2**70}, r"seed must be an integer in 0\.\.9223372036854775807"),
    "max-new-tokens-huge": ({"max_new_tokens": 10**12}, r"max_new_tokens must be an integer in 1\.\.2147483647"),
}


@pytest.mark.parametrize("fields, pattern", list(RAW_BAD.values()), ids=list(RAW_BAD))
def test_scheduler_rechecks_requests_from_other_clients(engine, reference, fields, pattern):
    answer = raw_request(engine.endpoint, **fields)
    assert isinstance(answer, RequestFailed), answer
    assert answer.kind == "request"
    assert answer.request_id == 77
    assert_matches(pattern, answer.message)
    assert_still_serves(engine, reference)


def test_scheduler_answers_a_valid_raw_request(engine):
    answer = raw_request(engine.endpoint, prompt="a valid prompt", max_new_tokens=8)
    assert isinstance(answer, Finished), answer
    assert answer.token_ids == engine.generate("a valid prompt", max_new_tokens=8).token_ids


GENERATE_TAG = encode(GenerateRequest(0))[0]
SHUTDOWN_TAG = encode(Shutdown())[0]


@pytest.mark.parametrize("frames, pattern", [
    ([b"garbage"], r"malformed"),
    ([b"\xff", b"{}"], r"malformed"),
    ([GENERATE_TAG, b"not json"], r"malformed"),
    ([GENERATE_TAG, b'{"request_id": 1, "bogus": 1}'], r"malformed.*bogus"),
    ([GENERATE_TAG, b'[1, 2]'], r"malformed.*not a JSON object"),
    ([GENERATE_TAG, b'{"prompt": "hi"}'], r"malformed.*request_id"),
    ([SHUTDOWN_TAG, b"{}"], r"unexpected Shutdown"),
    ([GENERATE_TAG, b'{"request_id": "7", "prompt": "hi"}'], r"request_id must be a 64-bit integer, got '7'"),
    ([GENERATE_TAG, b'{"request_id": 7, "prompt": [1, 1e400]}'], r"prompt must be a string or a list"),
    ([GENERATE_TAG, b'{"request_id": 7, "token": ["not", "text"]}'], r"token must be a string"),
    ([GENERATE_TAG, b"[" * 100000], r"nested too deeply"),
    ([GENERATE_TAG, b'{"request_id": 7, "prompt": "\xff\xfe"}'], r"malformed GenerateRequest: not JSON"),
], ids=["one-frame", "unknown-tag", "bad-json", "unknown-field", "json-list", "missing-field", "worker-message",
        "id-not-an-integer", "id-list-with-infinity", "token-not-text", "deep-json", "not-utf8"])
def test_scheduler_survives_malformed_messages(engine, reference, frames, pattern):
    answer = raw_exchange(engine.endpoint, frames)
    assert isinstance(answer, RequestFailed), answer
    assert answer.kind == "request"
    assert_matches(pattern, answer.message)
    assert_still_serves(engine, reference)


def assert_matches(pattern: str, message: str) -> None:
    assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"


# ---- bad configs: ConfigError from launch(), before any process starts ---------------------

BAD_CONFIGS = {
    "unknown-key": (config(draft={"modle": DRAFT}), r"unknown key\(s\) in \[draft\]: modle"),
    "unknown-section": ({**config(), "serve": {"max_context": 64}}, r"unknown config section\(s\): serve"),
    "missing-target-gguf": (config(target={"model": "/nonexistent/dir/target.gguf"}),
                            r"\[target\] model file not found: /nonexistent/dir/target\.gguf"),
    "missing-draft-gguf": (config(draft={"backend": "llama.cpp", "model": "/nonexistent/draft.gguf"}),
                           r"\[draft\] model file not found: /nonexistent/draft\.gguf"),
    "missing-model-dir": (config(target={"model": "/nonexistent/checkpoint"}), r"/nonexistent/checkpoint"),
    "draft-cores-do-not-exist": (config(draft={"cores": [99]}), r"\[draft\] cores \[99\] do not exist"),
    "target-cores-do-not-exist": (config(target={"cores": [0, 99]}), r"\[target\] cores \[99\] do not exist"),
    "scheduler-cores-do-not-exist": (config(server={"cores": [99]}), r"\[server\] cores \[99\] do not exist"),
    "cores-empty": (config(draft={"cores": []}), r"\[draft\] cores"),
    "cores-repeated": (config(draft={"cores": [0, 0]}), r"\[draft\] cores"),
    "bad-backend": (config(draft={"backend": "onnx"}), r"backend.*'onnx'"),
    "bad-target-backend": (config(target={"backend": "gguf"}),
                           r"\[target\] backend must be one of auto, transformers, native, llama.cpp, paced, got 'gguf'"),
    "native-target-needs-gguf": (config(target={"backend": "native"}),
                                 r"\[target\] backend 'native' needs a GGUF file, got model 'random:seed=0'"),
    "native-target-on-cuda": (config(target={"backend": "native", "model": "builtin:smollm2", "device": "cuda"}),
                              r"\[target\] backend 'native' runs on the CPU, got device 'cuda'"),
    "native-draft-needs-gguf": (config(draft={"backend": "native"}),
                                r"\[draft\] backend 'native' needs a GGUF file, got model 'random:seed=1'"),
    "bad-random-field": (config(target={"model": "random:vocab=big"}), r"vocab=big"),
    "mode-is-per-request": (config(decoding={"mode": "turbo"}), r"unknown key.*\[decoding\]: mode"),
    "gamma-zero": (config(decoding={"gamma": 0}), r"gamma"),
    "max-context-tiny": (config(server={"max_context": 4}), r"max_context"),
    "bad-transport": (config(server={"transport": "udp"}), r"transport.*'udp'"),
    "device-not-a-string": (config(target={"device": 5}), r"\[target\] device"),
    "n-ctx-not-an-integer": (config(draft={"n_ctx": "big"}), r"\[draft\] n_ctx"),
    "draft-weights-unknown": (config(draft={"weights": "q3_xs"}), r"\[draft\] weights must be one of .*q8_0.*got 'q3_xs'"),
    "draft-weights-torch-backend": (config(draft={"weights": "f16"}), r"weights = 'f16' needs backend 'llama.cpp'"),
    "prefill-weights-unknown": (config(draft={"prefill_weights": "fp8"}), r"\[draft\] prefill_weights must be 'same' or one of"),
    "prefill-weights-torch-backend": (config(draft={"prefill_weights": "bf16"}),
                                      r"prefill_weights = 'bf16' needs backend 'llama.cpp'"),
    "prompt-kv-unknown": (config(draft={"prompt_kv": "target"}), r"\[draft\] prompt_kv must be 'own' or 'auto'"),
    "draft-vocab-negative": (config(draft={"vocab": -5}), r"\[draft\] vocab"),
    "draft-vocab-torch-backend": (config(draft={"vocab": 4096}), r"\[draft\] vocab = 4096 needs backend 'native'"),
    "cpu-kernels-unknown": (config(target={"cpu_kernels": "mkl"}), r"\[target\] cpu_kernels must be one of gguf, onednn, torch"),
    "timeout-not-a-number": (config(server={"startup_timeout_s": "soon"}), r"startup_timeout_s"),
    "timeout-negative": (config(server={"startup_timeout_s": -1}), r"startup_timeout_s"),
    "flag-not-a-bool": (config(target={"prefill_borrows_draft_cores": "no"}), r"prefill_borrows_draft_cores"),
    "keep-drafting-not-auto-or-bool": (config(decoding={"keep_drafting": 1}),
                                       r"\[decoding\] keep_drafting must be 'auto', true or false, got 1"),
    "lookup-past-max-gamma": (config(decoding={"lookup": 9, "max_gamma": 8}),
                              r"\[decoding\] lookup \(9\) must not exceed max_gamma \(8\)"),
    "lookup-negative": (config(decoding={"lookup": -1}), r"\[decoding\] lookup must be in 0\.\.64"),
    "section-not-a-table": ({**config(), "decoding": 4}, r"\[decoding\] must be a table"),
    "max-context-huge": (config(server={"max_context": 2**40}), r"\[server\] max_context must be in 16\.\.16777216"),
    "timeout-nan": (config(server={"startup_timeout_s": math.nan}), r"startup_timeout_s must be in .*got nan"),
    "turn-infinite": (config(server={"turn_s": math.inf}), r"\[server\] turn_s must be in .*got inf"),
    "max-running-zero": (config(server={"max_running": 0}), r"\[server\] max_running must be .auto. or an integer in 1\.\.64"),
    "threads-huge": (config(draft={"threads": 10**30}), r"\[draft\] threads must be in 0\.\.1024"),
    "model-with-nul": (config(target={"model": "/models/a\x00b.gguf"}), r"\[target\] model"),
    "random-field-huge": (config(target={"model": "random:vocab=99999999999"}), r"bad random model field"),
    "random-init-unknown": (config(target={"model": "random:init=gpu"}), r"bad random model field 'init=gpu'.*init one of cpu, device"),
    "random-heads-do-not-divide": (config(target={"model": "random:hidden=30,heads=4"}), r"multiple of heads"),
}


@pytest.mark.parametrize("bad_config, pattern", list(BAD_CONFIGS.values()), ids=list(BAD_CONFIGS))
def test_bad_config_fails_before_any_process_starts(monkeypatch, engine, reference, bad_config, pattern):
    def no_launcher(*args, **kwargs):
        raise AssertionError("a Launcher was created for an invalid config")

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started for an invalid config")

    monkeypatch.setattr(hetspec.client, "Launcher", no_launcher)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(ConfigError, match=pattern):
        hetspec.launch(bad_config)
    monkeypatch.undo()
    assert_still_serves(engine, reference)


def test_bad_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=rf"config file not found: {missing}"):
        hetspec.launch(str(missing))
    broken = tmp_path / "broken.toml"
    broken.write_text("[draft\nmodel = ")
    with pytest.raises(ConfigError, match=r"invalid TOML"):
        hetspec.launch(broken)


# ---- workers load, but cannot work together: EngineStartError -------------------------------

def test_a_tokenizer_larger_than_its_model_is_an_engine_start_error(engine, reference):
    bad = config(draft={"model": "random:vocab=320,seed=1,tokenizer=smollm2"})
    with pytest.raises(EngineStartError, match=r"the draft's tokenizer has 49152 tokens but its model only 320"):
        hetspec.launch(bad)
    assert_still_serves(engine, reference)


def test_connect_to_nowhere_fails_fast(tmp_path):
    with pytest.raises(hetspec.EngineDeadError, match=r"no engine"):
        hetspec.connect(f"ipc://{tmp_path}/client.sock")
    stale = tmp_path / "stale.sock"
    stale.touch()                      # a socket file nobody listens on (e.g. after a crash)
    started = time.monotonic()
    with pytest.raises(hetspec.EngineDeadError, match=r"no engine answered"):
        hetspec.connect(f"ipc://{stale}", timeout_s=1.5)
    assert time.monotonic() - started < 30
