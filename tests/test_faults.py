"""Faults: what the engine survives, checked on its own counters and outputs.

- a killed draft costs speed only: the request finishes target-only with its exact
  output, the draft is restarted, and later requests speculate again;
- a killed target aborts the one request it was running (RequestAbortedError) and is
  restarted; queued and later requests succeed;
- a worker that keeps dying while it loads is given up, with its last log lines;
- a killed scheduler is started again by its launcher: the requests it held fail with
  RequestAbortedError, later ones succeed; one that keeps dying before it is ready is
  given up, an EngineDeadError for its clients, never a hang;
- a client that closes its stream, cancels, or dies has its request cancelled;
- timeout_s ends a request with finish_reason "timeout" and the tokens it has.

Every wait is bounded; nothing here asserts on wall-clock speed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

import hetspec
from hetspec import EngineDeadError, RequestAbortedError, RequestError
from hetspec.core.errors import InternalError

from helpers import (
    DEADLINE_S,
    TARGET,
    WEAK_DRAFT,
    Footprint,
    assert_nothing_left,
    call_within,
    children,
    cli_leftovers,
    full_only,
    load_reference,
    random_engine_config,
    start_long_request,
    start_serving,
    write_toml,
)

CONFIG = random_engine_config(draft=WEAK_DRAFT)
PROMPT = "Faults and limits"


@pytest.fixture(scope="module")
def engine():
    with hetspec.launch(CONFIG) as e:
        yield e


@pytest.fixture(scope="module")
def reference(engine):
    """The target's own greedy output (the engine's target-only mode is exact: test_engine_greedy)."""
    return engine.generate(PROMPT, max_new_tokens=300, mode="target").token_ids


def wait_for(condition, what: str, timeout_s: float = DEADLINE_S):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.1)
    return value


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)] if psutil.pid_exists(pid) else [], timeout=DEADLINE_S)


def worker(engine, role: str) -> dict:
    return engine.get_info()["workers"][role]


def ready_again(engine, role: str, restarts: int) -> dict:
    return wait_for(lambda: (w := worker(engine, role))["state"] == "ready" and w["restarts"] >= restarts and w,
                    f"the {role} worker's restart")


# ---- the draft -------------------------------------------------------------------------------

def test_a_draft_killed_between_requests_costs_only_speed(engine, reference):
    before = engine.get_info()
    old_pid, restarts = before["draft"]["pid"], before["restarts"]["draft"]
    cores = sorted(psutil.Process(old_pid).cpu_affinity())
    kill(old_pid)

    result = engine.generate(PROMPT, max_new_tokens=40)          # while the draft restarts, or just after
    assert result.token_ids == reference[:40]
    if result.stats["fallback"]:                                  # it ran target-only
        assert "draft" in result.stats["fallback"] and result.stats["spec_rounds"] == 0

    again = ready_again(engine, "draft", restarts + 1)
    assert again["pid"] != old_pid
    assert "SIGKILL" in again["deaths"][-1]["reason"]
    assert sorted(psutil.Process(again["pid"]).cpu_affinity()) == cores   # re-pinned where it was
    result = engine.generate(PROMPT, max_new_tokens=40)
    assert result.token_ids == reference[:40]
    assert result.stats["fallback"] is None and result.stats["spec_rounds"] > 0   # speculating again


@pytest.mark.parametrize("mode", full_only("duodec", "sequential", keep=["duodec"]))
def test_a_draft_killed_mid_request_finishes_it_target_only_and_exactly(engine, reference, mode):
    restarts = ready_again(engine, "draft", 0)["restarts"]
    stream = engine.stream(PROMPT, max_new_tokens=300, mode=mode)
    next(stream)
    kill(engine.get_info()["draft"]["pid"])
    for _ in stream:
        pass
    assert stream.result.token_ids == reference
    assert "draft worker" in stream.result.stats["fallback"] and stream.result.stats["target_only_rounds"] > 0
    ready_again(engine, "draft", restarts + 1)


# ---- the target ------------------------------------------------------------------------------

def test_a_target_killed_mid_request_aborts_it_and_the_engine_recovers(engine, reference):
    info = engine.get_info()
    restarts, aborted = info["restarts"]["target"], info["requests"].get("aborted", 0)
    thread, box = start_long_request(engine)
    kill(info["target"]["pid"])
    queued = {}                                                  # sent while the target restarts
    waiter = threading.Thread(target=lambda: queued.update(r=engine.generate(PROMPT, max_new_tokens=24)))
    waiter.start()
    thread.join(DEADLINE_S)
    waiter.join(DEADLINE_S)
    assert not thread.is_alive() and not waiter.is_alive(), "a request hung after the target was killed"
    assert isinstance(box.get("error"), RequestAbortedError), box
    assert "target worker" in str(box["error"]) and "SIGKILL" in str(box["error"])
    assert queued["r"].token_ids == reference[:24]
    info = engine.get_info()
    assert info["restarts"]["target"] == restarts + 1 and info["requests"]["aborted"] == aborted + 1
    assert info["dead"] is None


def test_a_target_killed_between_requests_is_restarted(engine, reference):
    restarts = engine.get_info()["restarts"]["target"]
    kill(engine.get_info()["target"]["pid"])
    assert engine.generate(PROMPT, max_new_tokens=24).token_ids == reference[:24]
    assert engine.get_info()["restarts"]["target"] == restarts + 1


# ---- crash loops -----------------------------------------------------------------------------

@pytest.mark.parametrize("role", full_only("draft", "target", keep=["target"]))
def test_a_worker_that_keeps_dying_is_given_up_with_its_last_log_lines(tmp_path, role):
    """Its weights go bad under it: every restart fails to load them."""
    load_reference(WEAK_DRAFT if role == "draft" else TARGET).save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)   # the scheduler reads a directory model's tokenizer (once, at start)
    config = random_engine_config(draft=str(tmp_path) if role == "draft" else WEAK_DRAFT,
                                  target=str(tmp_path) if role == "target" else TARGET)
    with hetspec.launch(config) as engine:
        expected = engine.generate(PROMPT, max_new_tokens=16, mode="target").token_ids
        for weights in tmp_path.glob("*.safetensors"):
            weights.write_bytes(b"not weights")
        kill(engine.get_info()[role]["pid"])
        given_up = wait_for(lambda: (w := worker(engine, role))["state"] == "failed" and w, "giving up")
        assert given_up["restarts"] == 3 and "3 times in a row" in given_up["failure"]
        assert "could not load its model" in given_up["failure"]           # from its log
        if role == "draft":   # the engine serves on, target-only
            result = engine.generate(PROMPT, max_new_tokens=16)
            assert result.token_ids == expected and "not restarted" in result.stats["fallback"]
        else:
            assert "not restarted" in engine.get_info()["dead"]
            _, error = call_within(DEADLINE_S, engine.generate, PROMPT, max_new_tokens=16)
            assert isinstance(error, EngineDeadError) and "could not load" in str(error), error


def byte_tokenizer():
    """One token per character (ids 0-255), in transformers' form: what a random target can read."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({chr(i): i for i in range(256)}, unk_token="?"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


# ---- a request that fails inside the engine ---------------------------------------------------

def short_context_model(path) -> str:
    """A real model that cannot run past 64 positions (GPT-2's learned position embeddings):
    a request that gets there fails inside both workers, through no fault of its own."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, initializer_range=0.25,
                               bos_token_id=None, eos_token_id=None)).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return str(path)


def test_a_request_the_engine_fails_on_is_an_internal_error_and_the_engine_serves_on(tmp_path):
    """The fault boundary: the draft's failure costs speed (the target goes on alone), the
    target's ends the request with an InternalError (HTTP 500) and the traceback in the
    scheduler's log; the next request's output is exact."""
    model = short_context_model(tmp_path / "gpt2")
    config = {"draft": {"backend": "torch", "model": model}, "target": {"model": model, "cpu_kernels": "torch"},
              "decoding": {"gamma": 4, "speculation": "always"}, "server": {"max_context": 200}}
    with hetspec.launch(config) as engine:
        expected = engine.generate("hello", max_new_tokens=10, mode="target").token_ids
        stream = engine.stream("x" * 40, max_new_tokens=60)
        streamed = []
        with pytest.raises(InternalError, match=r"the engine failed on this request \(WorkerError: target worker: "
                                                r"IndexError.*scheduler's log has the traceback"):
            streamed.extend(stream)
        assert streamed, "it failed after some tokens were streamed"
        result = engine.generate("hello", max_new_tokens=10)
        assert result.token_ids == expected and result.stats["spec_rounds"] > 0
        assert engine.get_info()["requests"]["failed"] == 1
        with open(os.path.join(engine._launcher.runtime_dir, "scheduler.log")) as log:
            assert "Traceback" in log.read()


# ---- the scheduler -----------------------------------------------------------------------------

def scheduler_pid(engine) -> int | None:
    """The launched engine's scheduler process, as its launcher knows it now."""
    return engine._launcher.scheduler.pid


def kill_scheduler(pid: int) -> None:
    """SIGKILL, and no more: its launcher (this process) must be the one to reap it."""
    os.kill(pid, signal.SIGKILL)


def test_a_killed_scheduler_aborts_its_requests_and_is_started_again(reference):
    """Both handles' requests in flight fail with RequestAbortedError (the launch()ed one by
    its launcher's count of starts, the connect()ed one over tcp by the closed connection);
    the launcher starts a new scheduler with fresh workers, and the next requests are exact."""
    before = children()
    engine = hetspec.launch({**CONFIG, "server": {"transport": "tcp", "host": "127.0.0.1"}})
    other = hetspec.connect(engine.endpoint)                       # over tcp, without the launcher's view
    mine, theirs = engine.stream(PROMPT, max_new_tokens=2000), other.stream(PROMPT, max_new_tokens=2000)
    next(mine)
    next(theirs)
    old = scheduler_pid(engine)
    kill_scheduler(old)
    for stream in (mine, theirs):
        _, error = call_within(DEADLINE_S, list, stream)
        assert isinstance(error, RequestAbortedError) and "scheduler" in str(error), error
    for handle in (engine, other):                                 # they wait for the new scheduler
        result, error = call_within(DEADLINE_S, handle.generate, PROMPT, max_new_tokens=24)
        assert error is None and result.token_ids == reference[:24], error
    info = engine.get_info()
    assert info["pid"] == scheduler_pid(engine) != old and info["dead"] is None
    assert info["scheduler"]["restarts"] == 1 and "SIGKILL" in info["scheduler"]["deaths"][-1]["reason"]
    footprint = Footprint.of(engine._launcher)
    other.close()
    engine.close()
    assert_nothing_left(footprint, before)                        # the old workers died with their scheduler


def test_a_scheduler_that_keeps_dying_is_given_up_with_its_last_log_lines():
    before = children()
    engine = hetspec.launch(CONFIG)
    footprint = Footprint.of(engine._launcher)
    pid = scheduler_pid(engine)
    kill_scheduler(pid)                                           # it was ready: it is started again
    for _ in range(3):                                            # ... and dies before it is ready, 3 times
        pid = wait_for(lambda old=pid: (p := scheduler_pid(engine)) != old and p, "a restart")
        kill_scheduler(pid)
    _, error = call_within(DEADLINE_S, engine.generate, PROMPT, max_new_tokens=8)
    assert isinstance(error, EngineDeadError), error
    assert "the scheduler died 3 times in a row before it was ready" in str(error) and "last log lines" in str(error)
    engine.close()
    assert_nothing_left(footprint, before)


def test_a_served_engine_starts_its_scheduler_again_and_says_so(tmp_path, reference):
    proc, endpoint, _ = start_serving(write_toml(tmp_path))
    try:
        client = hetspec.connect(endpoint)
        old = client.info["pid"]
        thread, box = start_long_request(client)
        kill(old)
        thread.join(DEADLINE_S)
        assert isinstance(box.get("error"), RequestAbortedError), box
        result, error = call_within(DEADLINE_S, client.generate, PROMPT, max_new_tokens=24)
        assert error is None and result.token_ids == reference[:24], error
        assert client.get_info()["pid"] != old
        client.close()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "the scheduler was killed by SIGKILL; it is starting again" in stderr, stderr
    assert cli_leftovers(proc.pid) == ([], [], [])


# ---- clients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", full_only("ipc", "tcp", keep=["tcp"]))
def test_a_client_process_that_dies_has_its_request_cancelled(transport):
    config = {**CONFIG, "server": {"transport": transport, "host": "127.0.0.1"}}
    with hetspec.launch(config) as engine:
        client = subprocess.Popen([sys.executable, "-c", f"""
import hetspec, time
stream = hetspec.connect({engine.endpoint!r}).stream("1, 2, 3, 4,", max_new_tokens=5000)
next(stream)
print("streaming", flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdout.readline().strip() == "streaming"
        finally:
            client.kill()
            client.wait()
        info = wait_for(lambda: (i := engine.get_info())["requests"].get("cancelled") and i, "the cancel")
        assert info["running"] == 0 and info["requests"].get("completed", 0) == 0
        result = engine.generate(PROMPT, max_new_tokens=8)          # the next request runs
        assert len(result.token_ids) == 8


def test_timeout_ends_a_request_with_the_tokens_it_has(engine, reference):
    counted = engine.get_info()["requests"].get("timeout", 0)
    result = engine.generate(PROMPT, max_new_tokens=300, timeout_s=0.3)
    assert result.finish_reason == "timeout" and result.stats["finish_reason"] == "timeout"
    assert 0 < len(result.token_ids) < 300 and result.token_ids == reference[:len(result.token_ids)]

    assert engine.get_info()["requests"]["timeout"] == counted + 1

    # one that times out in the queue, behind a long one, ends without tokens: an engine that
    # runs one request at a time (with turns, a waiting request can get one before its deadline)
    with hetspec.launch({**CONFIG, "server": {"max_running": 1}}) as single:
        running = single.stream("1, 2, 3, 4,", max_new_tokens=2000)
        next(running)
        queued = single.generate(PROMPT, max_new_tokens=8, timeout_s=0.2)
        assert queued.finish_reason == "timeout" and queued.token_ids == []
        running.close()
        assert single.get_info()["requests"]["timeout"] == 1


@pytest.mark.parametrize("timeout_s", [0, -1, float("inf"), "soon"])
def test_a_bad_timeout_is_refused(engine, timeout_s):
    with pytest.raises(RequestError, match="timeout_s"):
        engine.generate(PROMPT, max_new_tokens=4, timeout_s=timeout_s)
