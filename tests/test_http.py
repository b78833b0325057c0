"""The OpenAI-compatible server, for real: hetspec-launch --http in its own process
on loopback, driven by the openai client (sync and async) and by raw HTTP for the
SSE framing; its outputs checked against Engine.generate on the same engine, its
counters against the engine's own."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import hetspec
from hetspec.core.errors import AuthError

from helpers import orphaned_segments, random_engine_config

pytestmark = pytest.mark.integration          # the default SmolLM2 pair: chat needs its template
KEY = "test-key"
MODEL = "smollm2"
CHATS = ["What is the capital of France?", "Name three colours.", "Say hello.", "Count to five.",
         "What is 2 + 2?", "Name a fruit.", "What is water made of?", "Name a planet."]
DEADLINE_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """hetspec-launch [CONFIG] --http on a free loopback port; its engine reachable over zmq too."""

    def __init__(self, *args: str, api_key: str | None = KEY, host: str = "127.0.0.1"):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "hetspec.cli", *args, "--http", f"{host}:{self.port}"]
        if api_key:
            command += ["--api-key", api_key]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "HETSPEC_API_KEY": ""})
        self.endpoint = self.process.stdout.readline().strip()     # the zmq endpoint comes first
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.stderr.read()
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        self.engine = hetspec.connect(self.endpoint, token=api_key or "")

    def stop(self) -> str:
        self.engine.close()
        self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=DEADLINE_S)
        assert self.process.returncode == 0, stderr
        return stderr


@pytest.fixture(scope="module")
def server():
    server = Server()
    yield server
    server.stop()
    assert not orphaned_segments()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def chat_reference(server, content: str, max_tokens: int = 16):
    return server.engine.generate(messages=[{"role": "user", "content": content}], max_new_tokens=max_tokens)


def test_chat_and_completion_equal_engine_generate(server, client):
    want = chat_reference(server, CHATS[0])
    got = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": CHATS[0]}],
                                         max_tokens=16, temperature=0)
    assert got.choices[0].message.content == want.text
    assert got.usage.completion_tokens == len(want.token_ids)
    assert got.usage.prompt_tokens == want.stats["prompt_tokens"]
    want = server.engine.generate("The capital of France is", max_new_tokens=12)
    got = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert got.choices[0].text == want.text
    assert got.choices[0].finish_reason == {"length": "length", "eos": "stop", "stop": "stop"}[want.finish_reason]
    assert got.model_extra["hetspec"]["new_tokens"] == len(want.token_ids)    # the speculative statistics


def test_streamed_text_equals_the_whole_text(server, client):
    messages = [{"role": "user", "content": CHATS[1]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    pieces = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(pieces)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0)
    streamed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text.choices[0].text


def test_sse_framing(server):
    body = {"model": MODEL, "prompt": "One, two,", "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=DEADLINE_S,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert all(e["object"] == "text_completion" and e["id"] == events[0]["id"] for e in events)


def test_eight_concurrent_clients_all_complete(server):
    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0) as client:
            return await asyncio.gather(*[client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": c}], max_tokens=12, temperature=0) for c in CHATS])

    answers = asyncio.run(run())
    assert [a.choices[0].message.content for a in answers] == [chat_reference(server, c, 12).text for c in CHATS]
    assert sum(a.model_extra["hetspec"]["batched_rounds"] for a in answers) > 0      # they stepped together
    assert _value(_metrics(server), "hetspec:batch_size") >= 2


def _cancelled(server) -> int:
    return server.engine.get_info()["requests"].get("cancelled", 0)


def _wait_for(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_client_that_disconnects_has_its_request_cancelled(server):
    before = _cancelled(server)
    # counting: a greedy continuation that never reaches EOS, so only a cancel ends it early
    body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=DEADLINE_S,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        seen = 0
        for line in response.iter_lines():            # two events in, the client goes away
            seen += line.startswith("data: ")
            if seen == 2:
                break
    _wait_for(lambda: _cancelled(server) == before + 1, "the streamed request was not cancelled")
    with pytest.raises(httpx.ReadTimeout):                    # a whole response, abandoned while waiting
        httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, timeout=2,
                   headers={"Authorization": f"Bearer {KEY}"})
    _wait_for(lambda: _cancelled(server) == before + 2, "the waiting request was not cancelled")
    assert server.engine.generate("Hi", max_new_tokens=4).finish_reason in ("length", "eos")


BAD = {
    "n": ({"n": 2}, "n"),
    "logprobs": ({"logprobs": True}, "logprobs"),
    "unknown-model": ({"model": "gpt-4"}, "model"),
    "temperature": ({"temperature": -1}, None),
    "no-messages": ({"messages": []}, "messages"),
    "penalty": ({"presence_penalty": 0.5}, "presence_penalty"),
    "prompt-too-long": ({"messages": [{"role": "user", "content": "word " * 5000}]}, None),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("change, param", list(BAD.values()), ids=list(BAD))
def test_bad_requests_get_400_in_openais_shape_and_the_server_keeps_serving(server, client, change, param, stream):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream,
            **change}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=DEADLINE_S,
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param:
        assert error["param"] == param
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**body)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].finish_reason


def test_malformed_json_is_a_400(server):
    response = httpx.post(f"{server.url}/v1/completions", content=b"{not json", timeout=DEADLINE_S,
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_api_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.get(f"{server.url}/v1/models", headers=headers, timeout=DEADLINE_S)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{server.url}/health", timeout=DEADLINE_S).status_code == 200     # no key needed
    models = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY).models.list()
    assert [m.id for m in models.data] == [MODEL]
    with pytest.raises(AuthError):                  # the zmq side wants the same key
        hetspec.connect(server.endpoint, timeout_s=10)


def _metrics(server) -> dict:
    text = httpx.get(f"{server.url}/metrics", timeout=DEADLINE_S).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(metrics: dict, name: str, **labels) -> float:
    labels = {"model_name": MODEL, **labels}
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_by_what_the_request_reports(server, client):
    # SpS, forced: on a CPU the default pair's gate rests from speculating, and DuoDecoding's
    # draft, no faster than its target there, hands the target no window before it verifies
    before = _metrics(server)
    answer = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=24, temperature=0,
                                       extra_body={"mode": "sequential", "speculation": "always"})
    after = _metrics(server)
    stats = answer.model_extra["hetspec"]

    def moved(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("vllm:generation_tokens_total") == answer.usage.completion_tokens
    assert moved("vllm:prompt_tokens_total") == answer.usage.prompt_tokens
    assert moved("vllm:spec_decode_num_drafts_total") == stats["drafts"] > 0
    assert moved("vllm:spec_decode_num_draft_tokens_total") == stats["drafted"]
    assert moved("vllm:spec_decode_num_accepted_tokens_total") == stats["accepted"]
    assert sum(moved("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(len(stats["accepted_per_pos"]))) == stats["accepted"]
    assert moved("vllm:request_success_total", finished_reason="length") == 1
    assert moved("vllm:e2e_request_latency_seconds_count") == 1
    assert _value(after, "vllm:num_requests_waiting") == 0


def test_zmq_token_guards_a_launched_engine():
    config = random_engine_config()
    config["server"] = {"api_key": "secret"}
    with hetspec.launch(config) as engine:
        assert engine.generate([1, 2, 3], max_new_tokens=3).finish_reason == "length"
        assert engine.get_info()["config"]["server"]["api_key"] == "(set)"    # never handed out
        with pytest.raises(AuthError):
            hetspec.connect(engine.endpoint, timeout_s=10).generate([1, 2, 3], max_new_tokens=3)
        assert hetspec.connect(engine.endpoint, token="secret").generate([1, 2, 3], max_new_tokens=3).token_ids


def _queueless_server(tmp_path) -> Server:
    """Random models, nothing allowed to wait behind a running request, on a public address
    without an API key."""
    toml = tmp_path / "random.toml"
    toml.write_text('[draft]\nbackend = "torch"\nmodel = "random:seed=1"\n\n[target]\nmodel = "random:seed=0"\n\n'
                    '[server]\nmax_queue = 0\n')
    return Server(str(toml), api_key=None, host="0.0.0.0")


def _stopped(server: Server) -> str:
    """Stop the server without asserting (the test does, after its own checks); its stderr."""
    server.engine.close()
    server.process.send_signal(signal.SIGINT)
    return server.process.communicate(timeout=DEADLINE_S)[1]


def _engine_process(server: Server, module: str):
    import psutil

    [process] = [p for p in psutil.Process(server.process.pid).children(recursive=True)
                 if module in " ".join(p.cmdline())]
    return process


LONG = {"prompt": "abc", "max_tokens": 3000, "temperature": 0, "stream": True}
SHORT = {"prompt": "hi", "max_tokens": 3, "temperature": 0}


def test_busy_is_a_503_and_a_public_address_without_key_warns(tmp_path):
    server = _queueless_server(tmp_path)
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=LONG, timeout=DEADLINE_S) as running:
            lines = running.iter_lines()      # kept open: closing it would disconnect (and cancel)
            assert next(lines).startswith("data: ")
            busy = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3},
                              timeout=DEADLINE_S)
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "engine_busy", busy.text
    finally:
        stderr = _stopped(server)
    assert server.process.returncode == 0, stderr
    assert "without --api-key" in stderr


def test_a_killed_worker_or_scheduler_is_started_again(tmp_path):
    server = _queueless_server(tmp_path)
    try:
        _engine_process(server, "hetspec.workers.target").kill()   # restarted: the next request waits for it
        response = httpx.post(f"{server.url}/v1/completions", json=SHORT, timeout=DEADLINE_S)
        assert response.status_code == 200, response.text
        assert httpx.get(f"{server.url}/health", timeout=DEADLINE_S).json() == {"status": "ok"}
        assert 'hetspec:worker_restarts{model_name="random",worker="target"} 1.0' in \
            httpx.get(f"{server.url}/metrics", timeout=DEADLINE_S).text
        args = _engine_process(server, "hetspec.workers.target").cmdline()
        spec = json.loads(args[args.index("--spec") + 1])
        assert (spec["caches"], spec["fit_caches"]) == (4, False)   # max_running "auto": the first one's, not fitted anew

        # The scheduler killed under a streaming request: that request ends with an error event,
        # the launcher (the server's process) starts a new scheduler, and the next request is served.
        with httpx.stream("POST", f"{server.url}/v1/completions", json=LONG, timeout=DEADLINE_S) as running:
            lines = running.iter_lines()
            assert next(lines).startswith("data: ")
            _engine_process(server, "hetspec.scheduler").kill()
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["error"]["code"] == "request_aborted", events[-1]
        again = httpx.post(f"{server.url}/v1/completions", json=SHORT, timeout=DEADLINE_S)
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == response.json()["choices"][0]["text"], again.text
        assert httpx.get(f"{server.url}/health", timeout=DEADLINE_S).json() == {"status": "ok"}
        assert 'hetspec:scheduler_restarts{model_name="random"} 1.0' in \
            httpx.get(f"{server.url}/metrics", timeout=DEADLINE_S).text
    finally:
        stderr = _stopped(server)
    assert server.process.returncode == 0, stderr
    assert "the scheduler was killed by SIGKILL; it is starting again" in stderr, stderr


def test_hostile_input_is_a_400_and_a_failure_inside_the_engine_a_500(tmp_path):
    """A prompt with a lone surrogate (valid JSON, and Python reads it) is a 400 naming it;
    a request the engine fails on (a model that cannot run past 64 positions) is a 500 in
    OpenAI's shape; the server serves on after both."""
    from test_faults import short_context_model

    model = short_context_model(tmp_path / "gpt2")
    toml = tmp_path / "short.toml"
    toml.write_text(f'[draft]\nbackend = "torch"\nmodel = "{model}"\n[target]\nmodel = "{model}"\ncpu_kernels = "torch"\n'
                    '[decoding]\ngamma = 4\n[server]\nmax_context = 200\n')
    server = Server(str(toml), api_key=None)
    try:
        url = f"{server.url}/v1/completions"
        surrogate = httpx.post(url, content=b'{"prompt": "\\ud800 x", "max_tokens": 4}', timeout=DEADLINE_S,
                               headers={"content-type": "application/json"})
        assert surrogate.status_code == 400, surrogate.text
        assert "its character 0 is a lone surrogate (U+D800)" in surrogate.json()["error"]["message"]
        failed = httpx.post(url, json={"prompt": "x" * 40, "max_tokens": 60, "temperature": 0}, timeout=DEADLINE_S)
        assert failed.status_code == 500, failed.text
        assert failed.json()["error"]["type"] == "server_error" and failed.json()["error"]["code"] == "internal_error"
        fine = httpx.post(url, json={"prompt": "hello", "max_tokens": 8, "temperature": 0}, timeout=DEADLINE_S)
        assert fine.status_code == 200 and fine.json()["usage"]["completion_tokens"] == 8
    finally:
        server.stop()
