"""Faults: what the engine survives, checked on its own counters and outputs.

- a killed draft costs speed only: the request finishes target-only with its exact
  output, the draft is restarted, and later requests speculate again;
- a killed target aborts the one request it was running (RequestAbortedError) and is
  restarted; queued and later requests succeed;
- a worker that keeps dying while it loads is given up, with its last log lines;
- a killed scheduler is an EngineDeadError for its clients, never a hang, and a
  served engine exits non-zero saying why;
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
from test_lifecycle import (
    DEADLINE_S,
    Footprint,
    assert_nothing_left,
    call_within,
    children,
    cli_leftovers,
    start_long_request,
    start_serving,
    write_toml,
)

import hetspec
from hetspec import EngineDeadError, RequestAbortedError, RequestError

from helpers import TARGET, WEAK_DRAFT, load_reference, random_engine_config

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


@pytest.mark.parametrize("mode", ["duodec", "sequential"])
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

@pytest.mark.parametrize("role", ["draft", "target"])
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


# ---- the scheduler -----------------------------------------------------------------------------

def test_a_killed_scheduler_is_an_engine_dead_error_for_every_client():
    before = children()
    engine = hetspec.launch({**CONFIG, "server": {"transport": "tcp", "host": "127.0.0.1"}})
    footprint = Footprint.of(engine._launcher)
    other = hetspec.connect(engine.endpoint)                       # over tcp, without the launcher's view
    stream = other.stream(PROMPT, max_new_tokens=2000)
    next(stream)
    kill(engine.info["pid"])
    _, error = call_within(DEADLINE_S, list, stream)
    assert isinstance(error, EngineDeadError), error
    _, error = call_within(DEADLINE_S, engine.generate, PROMPT, max_new_tokens=8)
    assert isinstance(error, EngineDeadError) and "scheduler" in str(error), error
    other.close()
    engine.close()
    assert_nothing_left(footprint, before)                        # the workers died with it


def test_a_served_engine_exits_non_zero_when_its_scheduler_dies(tmp_path):
    proc, endpoint, _ = start_serving(write_toml(tmp_path))
    try:
        client = hetspec.connect(endpoint)
        kill(client.info["pid"])
        client.close()
        _, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode not in (0, None) and "scheduler" in stderr, stderr
    assert cli_leftovers(proc.pid) == ([], [], [])


# ---- clients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["ipc", "tcp"])
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

    # one that times out in the queue, behind a long one, ends without tokens
    running = engine.stream("1, 2, 3, 4,", max_new_tokens=2000)
    next(running)
    queued = engine.generate(PROMPT, max_new_tokens=8, timeout_s=0.2)
    assert queued.finish_reason == "timeout" and queued.token_ids == []
    running.close()
    assert engine.get_info()["requests"]["timeout"] == counted + 2


@pytest.mark.parametrize("timeout_s", [0, -1, float("inf"), "soon"])
def test_a_bad_timeout_is_refused(engine, timeout_s):
    with pytest.raises(RequestError, match="timeout_s"):
        engine.generate(PROMPT, max_new_tokens=4, timeout_s=timeout_s)
