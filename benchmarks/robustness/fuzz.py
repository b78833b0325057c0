"""hetspec-fuzz: Hypothesis sends hostile input to every surface of a running engine, and to configs
(benchmarks/README.md, "hetspec-fuzz"). Every input must be answered within BOUND_S by a completion or
an error in the documented shape; after each surface the engine must be alive, unrestarted, greedy-exact.

    hetspec-fuzz --examples 10000 --out DIR      the long form (its report: benchmarks/reports/fuzz/)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import httpx
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

import hetspec
from hetspec import RequestError
from hetspec.benchmarks.bench.machine import describe_machine
from hetspec.benchmarks.bench.served import HetspecServer
from hetspec.benchmarks.bench.tables import table, write_outputs
from hetspec.benchmarks.robustness import fuzz_inputs as inputs
from hetspec.config import load_config
from hetspec.core.errors import ConfigError, InternalError
from hetspec.ipc import codec, messages

BOUND_S = 30.0             # an answer later than this is a hang
KEY = "fuzz-key"
MODEL = "fuzz"
PROBE = "A greedy probe"
CONFIG = """[draft]
backend = "torch"
model = "random:vocab=49152,tokenizer=smollm2,seed=1"
[target]
model = "random:vocab=49152,tokenizer=smollm2,seed=0"
[server]
max_context = 256
max_new_tokens = 32
"""
SURFACES = {"http": 0.35, "client": 0.25, "wire": 0.25, "config": 0.15}    # each one's share of --examples
ERROR_STATUSES = {400, 401, 404, 405, 413}


class Finding(AssertionError):
    """An input that broke the property."""


class Tally:
    """What one surface saw: how inputs were answered, and how long answers took."""

    def __init__(self):
        self.outcomes, self.seconds = Counter(), []

    def summary(self) -> dict:
        s = sorted(self.seconds) or [0.0]
        return {"inputs": len(self.seconds), "outcomes": dict(self.outcomes.most_common()),
                "median_s": statistics.median(s), "max_s": s[-1]}


class Served:
    """hetspec-launch CONFIG --http with an API key, its engine reachable over zmq too: the same engine serves
    every surface but config."""

    def __init__(self, workdir: str):
        toml = Path(workdir) / "fuzz.toml"
        toml.write_text(CONFIG)
        self.server = HetspecServer(str(toml), Path(workdir) / "server.log", "--api-key", KEY,
                                    "--served-model-name", MODEL, api_key=KEY)
        self.endpoint, self.engine = self.server.endpoint, hetspec.connect(self.server.endpoint, token=KEY)
        self.http, self.zmq = httpx.Client(base_url=self.server.url, timeout=BOUND_S), zmq.Context()
        self.reference = self.engine.generate(PROBE, max_new_tokens=24).token_ids
        self.n_vocab = self.engine.info["n_vocab"]

    def health(self) -> dict:
        """Alive, no restart since it started, and exact: what a surface must leave behind."""
        info = self.engine.get_info(timeout_s=BOUND_S)
        restarts = {**info["restarts"], "scheduler": info["scheduler"]["restarts"]}
        exact = self.engine.generate(PROBE, max_new_tokens=24).token_ids == self.reference
        alive = self.server.process.poll() is None and not info["dead"]
        ok = alive and not any(restarts.values()) and exact
        return {"alive": alive, "restarts": restarts, "exact": exact, "ok": ok, "requests": info["requests"]}

    def close(self) -> None:
        self.http.close()
        self.engine.close()
        self.zmq.term()
        self.server.stop()


def http_once(served: Served, request: dict) -> str:
    headers = {k: v.encode("latin-1") for k, v in request["headers"].items()}
    if request["auth"] != "none":
        headers["authorization"] = (f"Bearer {KEY}" if request["auth"] == "good" else request["auth"]).encode("latin-1")
    try:
        with served.http.stream(request["method"], request["path"], headers=headers, content=request["body"]) as r:
            lines = list(r.iter_lines())
    except httpx.TimeoutException:
        raise Finding(f"no answer within {BOUND_S} s: {request}") from None
    return _check_http(r.status_code, r.headers.get("content-type", ""), lines, request)


def _check_http(status: int, content_type: str, lines: list[str], request: dict) -> str:
    text = "\n".join(lines)
    if status in ERROR_STATUSES:
        _error_shape(text, request)
        return str(status)
    if status != 200:
        raise Finding(f"status {status} ({text[:300]}) for {request}")
    if "text/event-stream" in content_type:
        return _check_stream(lines, request)
    if request["path"] == "/metrics":
        return "200 metrics"
    body = json.loads(text)
    if request["path"].startswith("/v1/") and request["path"].endswith("completions"):
        choice = body["choices"][0]
        assert isinstance(choice.get("text", choice.get("message", {}).get("content")), str), body
        assert body["usage"]["completion_tokens"] <= 32, body
    return "200"


def _check_stream(lines: list[str], request: dict) -> str:
    """Server-sent events of JSON that end in [DONE], or in an error event in OpenAI's shape."""
    events = [line[6:] for line in lines if line.startswith("data: ")]
    if not events or (events[-1] != "[DONE]" and "error" not in json.loads(events[-1])):
        raise Finding(f"a stream that neither ends in [DONE] nor in an error: {events[-3:]} for {request}")
    for event in events[:-1]:
        json.loads(event)
    if events[-1] != "[DONE]":
        _error_shape(events[-1], request)
        return "200 stream, error event"
    return "200 stream"


def _error_shape(text: str, request: dict) -> None:
    try:
        error = json.loads(text)["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        assert set(error) == {"message", "type", "param", "code"}
    except (ValueError, KeyError, TypeError, AssertionError):
        raise Finding(f"an error not in OpenAI's shape: {text[:300]!r} for {request}") from None


def client_once(served: Served, call: dict) -> str:
    args, kwargs = (call["prompt"],), {"messages": call["messages"], "params": call["params"], **call["overrides"]}
    try:
        if call["stream"]:
            stream = served.engine.stream(*args, **kwargs)
            pieces = list(stream)
            result = stream.result
            assert "".join(pieces) == result.text, "the streamed pieces are the text"
        else:
            result = served.engine.generate(*args, **kwargs)
        assert result.finish_reason in ("eos", "stop", "length", "cancelled", "timeout"), result
        assert len(result.token_ids) <= 32 and all(0 <= t < served.n_vocab for t in result.token_ids), result
        return f"Result ({result.finish_reason})"
    except InternalError as exc:
        raise Finding(f"an internal error: {exc} for {call!r}") from None
    except RequestError:
        return "RequestError"
    except Exception as exc:
        raise Finding(f"{type(exc).__name__}: {exc} for {call!r}") from exc


def wire_once(served: Served, frames: list[bytes]) -> str | None:
    try:                                        # what the frames are, as the scheduler will read them
        sent = codec.decode(frames)
    except codec.Malformed:
        sent = None
    if isinstance(sent, messages.StopEngine) and sent.token == KEY:
        return None                             # a stop with the key stops the engine: that is its job
    sock = served.zmq.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(served.endpoint)
    try:
        sock.send_multipart(frames)
        if isinstance(sent, messages.CancelRequest):   # no answer: the engine must still answer the next
            return "CancelRequest (no answer)"
        answer = None
        while answer is None or isinstance(answer, messages.TokensEvent):    # the first that is not a stream's tokens
            if not sock.poll(int(BOUND_S * 1000)):
                raise Finding(f"no answer within {BOUND_S} s to {frames!r}"[:2000])
            answer = codec.decode(sock.recv_multipart())
    finally:
        sock.close()
    if not isinstance(answer, (messages.Finished, messages.RequestFailed, messages.EngineInfo)):
        raise Finding(f"answered {answer!r} to {frames!r}"[:2000])
    if isinstance(answer, messages.RequestFailed) and answer.kind not in ("request", "auth"):
        raise Finding(f"a {answer.kind} failure: {answer.message} for {frames!r}"[:2000])
    return f"RequestFailed ({answer.kind})" if isinstance(answer, messages.RequestFailed) else type(answer).__name__


def config_once(value) -> str:
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "fuzz.toml")
            if isinstance(value, str):
                path.write_text(value, encoding="utf-8", errors="surrogatepass")
            load_config(str(path) if isinstance(value, str) else value)
        return "EngineConfig"
    except ConfigError:
        return "ConfigError"
    except Exception as exc:
        raise Finding(f"{type(exc).__name__}: {exc} for {value!r}"[:2000]) from exc


def run_surface(surface: str, served: Served | None, examples: int, seed: int | None = None,
                derandomize: bool = False) -> Tally:
    """Hypothesis draws `examples` inputs for the surface; a Finding is shrunk and raised."""
    tally = Tally()
    strategy, once = {
        "http": (inputs.http_requests(), lambda x: http_once(served, x)),
        "client": (inputs.client_calls(), lambda x: client_once(served, x)),
        "wire": (inputs.wire_frames(KEY), lambda x: wire_once(served, x)),
        "config": (inputs.config_dicts() | inputs.toml_texts(), config_once),
    }[surface]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink], print_blob=True)
    @given(strategy)
    def check(value):
        started = time.monotonic()
        try:
            outcome = once(value)           # how the input was answered (None: it is not one to count)
        except Finding:
            raise
        except Exception as exc:
            raise Finding(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}") from exc
        seconds = time.monotonic() - started
        if seconds > BOUND_S:
            raise Finding(f"answered after {seconds:.1f} s: {value!r}"[:2000])
        if outcome is not None:
            tally.outcomes[outcome] += 1
            tally.seconds.append(seconds)

    if seed is not None and not derandomize:
        check = hypothesis_seed(seed)(check)
    check()
    return tally


def fuzz_surface(served: Served, surface: str, examples: int, seed: int) -> dict:
    """One surface's run and the engine's health after it; a finding is recorded, the next surface still runs."""
    print(f"hetspec-fuzz: {surface}, {examples} examples", file=sys.stderr, flush=True)
    finding = None
    try:
        tally = run_surface(surface, served, examples, seed)
    except Exception as exc:  # noqa: BLE001 - Hypothesis raises a Finding, or a group of them
        finding, tally = "".join(traceback.format_exception_only(exc)), Tally()
        traceback.print_exception(exc)
    summary = {**tally.summary(), "finding": finding, "after": served.health()}
    print(json.dumps(summary, indent=1, default=str), file=sys.stderr, flush=True)
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hetspec-fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10000, help="inputs in all, shared among the surfaces")
    parser.add_argument("--surfaces", nargs="+", default=list(SURFACES), choices=SURFACES)
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis's seed (default: random, recorded)")
    parser.add_argument("--out", default="fuzz-out")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    total = sum(SURFACES[s] for s in args.surfaces)
    results = {"seed": seed, "command": " ".join(["hetspec-fuzz", *(argv or sys.argv[1:])]), "surfaces": {},
               "machine": describe_machine()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hetspec-fuzz-") as workdir:
        served = Served(workdir)
        try:
            for surface in args.surfaces:
                examples = max(1, round(args.examples * SURFACES[surface] / total))
                results["surfaces"][surface] = fuzz_surface(served, surface, examples, seed)
        finally:
            served.close()
    results["seconds"] = time.monotonic() - started
    failed = [s for s, r in results["surfaces"].items() if r["finding"] or not r["after"]["ok"]]
    results["passed"] = not failed
    write_outputs(args.out, results, report(results))
    print(report(results))
    return 1 if failed else 0


def report(results: dict) -> str:
    surfaces, findings = results["surfaces"], [r["finding"] for r in results["surfaces"].values() if r["finding"]]
    rows = [[surface, str(r["inputs"]), ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()),
             f"{r['median_s'] * 1000:.0f} ms", f"{r['max_s']:.2f} s", r["finding"] or "none",
             f"{r['after']['alive']}, {sum(r['after']['restarts'].values())}, {r['after']['exact']}"]
            for surface, r in surfaces.items()]
    return "\n".join([
        "# hetspec-fuzz", "",
        (f"`{results['command']}`, Hypothesis seed {results['seed']}, {results['seconds']:.0f} s; "
         f"{results['machine']['cpu']}, git {results['machine']['git_commit']}."), "",
        f"- inputs tried: {sum(r['inputs'] for r in surfaces.values())}",
        ("- engine deaths (scheduler or worker restarts): "
         f"{sum(sum(r['after']['restarts'].values()) for r in surfaces.values())}"),
        f"- hangs (no answer within {BOUND_S:g} s): {sum('no answer' in f for f in findings)}",
        f"- answers in the wrong shape, or other findings: {len(findings)}",
        ("- a greedy request after each surface gave the tokens it gave before: "
         f"{all(r['after']['exact'] for r in surfaces.values())}"), "",
        *table(["surface", "inputs", "answered as", "median", "slowest", "finding", "after: alive, restarts, exact"],
               rows), "",
        ("Each input is answered by a completion or an error in the documented shape (HTTP: OpenAI's error "
         "object with status 400, 401, 404, 405 or 413; Python: a RequestError; zmq: a RequestFailed of kind "
         "request or auth; configs: a ConfigError). The config surface starts no engine; the others share one "
         "(tiny random models with SmolLM2's tokenizer, `[server] max_new_tokens = 32`, an API key)."), ""])


if __name__ == "__main__":
    sys.exit(main())
