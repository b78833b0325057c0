"""Lifecycle: an engine leaves nothing behind (processes, /dev/shm segments, its runtime
directory) however it ends - closed, left by a `with` block, or failed to start - and
never leaves a client hanging (killed processes: test_faults.py). Also: several clients at
once, connect(), streaming, and the hetspec-launch CLI (one-shot --json, serve mode
stopped by SIGINT / SIGTERM, and killed by SIGKILL mid-request).

Every wait is bounded (a thread joined with a timeout, a process waited with a timeout),
so a hang fails the test instead of stalling the run (the helpers: tests/helpers.py).
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

import hetspec
import hetspec.client
from hetspec import EngineDeadError, EngineStartError, HetspecError
from hetspec.launcher import Launcher

from helpers import (
    CLI_TIMEOUT_S,
    DEADLINE_S,
    FULL,
    TARGET,
    WEAK_DRAFT,
    Footprint,
    assert_exit,
    assert_nothing_left,
    call_within,
    children,
    cli_leftovers,
    start_long_request,
    start_serving,
    write_toml,
)

CONFIG = {"draft": {"backend": "torch", "model": WEAK_DRAFT}, "target": {"model": TARGET}, "decoding": {"gamma": 4}}


# ---- leaving nothing behind -----------------------------------------------------------------

def test_with_block_leaves_nothing_even_with_a_request_in_flight():
    before = children()
    with hetspec.launch(CONFIG) as engine:
        launcher = engine._launcher
        footprint = Footprint.of(launcher)
        # while it runs, the things we check for afterwards do exist
        assert len(footprint.segments()) >= 2
        assert os.path.isdir(footprint.runtime_dir)
        # the launcher starts the scheduler, which starts (and supervises) both workers
        scheduler = psutil.Process(launcher.processes["scheduler"].pid)
        assert engine.info["pid"] == scheduler.pid
        assert {p.pid for p in scheduler.children()} >= {engine.info["draft"]["pid"], engine.info["target"]["pid"]}
        assert {p.pid for p in children() - before} >= {scheduler.pid, engine.info["draft"]["pid"]}
        assert len(engine.generate("Hello", max_new_tokens=8).token_ids) == 8

        # a long request from another thread is still running when the block ends
        thread, box = start_long_request(engine)
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the in-flight request hung after the engine was closed"
    assert isinstance(box.get("error"), EngineDeadError), box
    assert_nothing_left(footprint, before)
    # a clean stop: the scheduler gave up the request when asked to stop, and left by itself
    # (its workers had left too: it waits for them)
    assert launcher.processes["scheduler"].returncode == 0
    engine.close()                                            # closing twice is harmless
    with pytest.raises(HetspecError, match="closed"):
        engine.generate("Hello", max_new_tokens=4)


def test_failed_start_leaves_nothing(monkeypatch):
    launchers = []

    class RecordingLauncher(Launcher):
        def __init__(self, config):
            super().__init__(config)
            launchers.append(self)

    monkeypatch.setattr(hetspec.client, "Launcher", RecordingLauncher)
    before = children()
    bad = {**CONFIG, "draft": {"backend": "torch", "model": "random:vocab=320,seed=1,tokenizer=smollm2"}}
    with pytest.raises(EngineStartError, match="tokenizer has 49152 tokens"):
        hetspec.launch(bad)
    [launcher] = launchers
    assert launcher.processes["scheduler"].returncode is not None   # it started, and its workers, then stopped
    # its processes have all exited (and were reaped), so the footprint has none left to wait for
    assert_nothing_left(Footprint(launcher.run_id, launcher.runtime_dir, []), before)


# ---- one engine, many clients -----------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    with hetspec.launch(CONFIG) as e:
        yield e


PROMPTS = ["The first client", "A second client", "and a third one", [5, 17, 300, 42]]


@pytest.fixture(scope="module")
def references(engine) -> dict:
    """Each prompt's greedy output, one request at a time."""
    return {str(p): engine.generate(p, max_new_tokens=24).token_ids for p in PROMPTS}


def test_concurrent_clients_get_single_request_outputs(engine, references):
    other = hetspec.connect(engine.endpoint)
    jobs = [(engine, PROMPTS[0]), (engine, PROMPTS[1]), (engine, PROMPTS[2]), (other, PROMPTS[3]),
            (other, PROMPTS[0])]
    barrier = threading.Barrier(len(jobs))
    results: dict[int, object] = {}

    def run(i, handle, prompt):
        barrier.wait(DEADLINE_S)
        try:
            results[i] = [handle.generate(prompt, max_new_tokens=24).token_ids for _ in range(2)]
        except BaseException as exc:  # noqa: BLE001
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, h, p), daemon=True) for i, (h, p) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S * 2)
    assert not any(t.is_alive() for t in threads), "a concurrent request hung"
    for i, (_, prompt) in enumerate(jobs):
        assert results[i] == [references[str(prompt)]] * 2, f"client {i} ({prompt!r}): {results[i]}"
    other.close()


def test_connect_shares_the_engine_and_its_close_does_not_stop_it(engine, references):
    other = hetspec.connect(engine.endpoint)
    assert other.info["pid"] == engine.info["pid"]
    assert other.info["target"]["pid"] == engine.info["target"]["pid"]
    assert other.generate(PROMPTS[1], max_new_tokens=24).token_ids == references[str(PROMPTS[1])]
    other.close()
    other.close()
    with pytest.raises(HetspecError, match="closed"):
        other.generate(PROMPTS[1], max_new_tokens=4)
    # the engine is still there: same processes, still serving, reachable again
    assert psutil.pid_exists(engine.info["pid"]) and psutil.pid_exists(engine.info["target"]["pid"])
    assert engine.generate(PROMPTS[1], max_new_tokens=24).token_ids == references[str(PROMPTS[1])]
    again = hetspec.connect(engine.endpoint)
    assert again.generate(PROMPTS[2], max_new_tokens=24).token_ids == references[str(PROMPTS[2])]
    again.close()


def test_each_process_is_pinned_where_the_config_says(engine):
    """Draft and target on cores of their own; the scheduler beside the target ("auto")."""
    info = engine.info
    affinity = {role: sorted(psutil.Process(pid).cpu_affinity())
                for role, pid in (("scheduler", info["pid"]), ("draft", info["draft"]["pid"]),
                                  ("target", info["target"]["pid"]))}
    assert affinity["draft"] == info["draft"]["cores"]
    assert affinity["target"] == info["target"]["cores"]
    assert affinity["scheduler"] == info["config"]["server"]["cores"] == info["target"]["cores"]


def test_stream_pieces_join_to_the_generated_text(engine):
    prompt = "Stream me some text"
    result = engine.generate(prompt, max_new_tokens=48)
    pieces = list(engine.stream(prompt, max_new_tokens=48))
    assert all(isinstance(p, str) and p for p in pieces)
    assert len(pieces) > 1, pieces
    assert "".join(pieces) == result.text
    assert engine.last_result.token_ids == result.token_ids
    assert engine.last_result.text == result.text


def test_stream_with_a_stop_string_joins_to_the_generated_text(engine):
    prompt = "Stream me some text"
    full = engine.generate(prompt, max_new_tokens=48).text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    expected = full[:full.find(stop)]
    result = engine.generate(prompt, max_new_tokens=48, stop=stop)
    assert result.finish_reason == "stop"
    assert result.text == expected
    assert "".join(engine.stream(prompt, max_new_tokens=48, stop=stop)) == expected


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_a_stream_stopped_early_still_joins_to_its_result_text(engine, how):
    """Text held back in case it begins a stop string ("e" of "e\\0") is streamed when the
    request is cut short too: the pieces always join to the result's text."""
    extra = {"timeout_s": 0.3} if how == "timeout" else {}
    stream = engine.stream("Stream me some text", max_new_tokens=2000, stop=["e\0", " \0"], **extra)
    pieces = [next(stream)]
    if how == "cancel":
        engine.cancel(stream.request_id)
    pieces.extend(stream)
    assert stream.result.finish_reason == ("cancelled" if how == "cancel" else "timeout")
    assert "".join(pieces) == stream.result.text


def _cancelled(engine) -> int:
    return engine.get_info()["requests"].get("cancelled", 0)


def test_a_stream_abandoned_midway_does_not_disturb_the_next_request(engine, references):
    before = _cancelled(engine)
    pieces = engine.stream(PROMPTS[0], max_new_tokens=200)
    assert next(pieces)
    pieces.close()                                        # the client stops listening: the request is cancelled
    _, error = call_within(DEADLINE_S, engine.generate, PROMPTS[1], max_new_tokens=24)
    assert error is None, error
    assert engine.last_result.token_ids == references[str(PROMPTS[1])]
    assert _cancelled(engine) == before + 1


def test_cancel_ends_a_running_request_with_the_tokens_it_has(engine, references):
    before = _cancelled(engine)
    stream = engine.stream(PROMPTS[0], max_new_tokens=2000)
    first = next(stream)
    engine.cancel(stream.request_id)                      # as another thread would
    list(stream)
    result = stream.result
    assert result.finish_reason == "cancelled" and result.stats["finish_reason"] == "cancelled"
    assert 0 < len(result.token_ids) < 2000
    n = min(len(result.token_ids), 24)                    # what it has is the greedy output so far
    assert result.token_ids[:n] == references[str(PROMPTS[0])][:n]
    assert result.text.startswith(first) and _cancelled(engine) == before + 1


def test_closing_does_not_wait_for_a_stream_nobody_reads():
    engine = hetspec.launch(CONFIG)
    kept = engine.stream("Hello", max_new_tokens=2000)      # started, then neither read nor closed
    assert next(kept)
    _, error = call_within(DEADLINE_S, engine.close)
    assert error is None, error


def test_a_full_queue_is_a_busy_error_and_the_queued_request_still_runs():
    with hetspec.launch({**CONFIG, "server": {"max_queue": 1}}) as engine:
        running = engine.stream("Hello", max_new_tokens=2000)
        assert next(running)
        queued = engine.stream("Hi", max_new_tokens=4)              # the queue holds one
        deadline = time.monotonic() + DEADLINE_S
        while engine.get_info()["waiting"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.05)
        with pytest.raises(hetspec.EngineBusyError, match=r"busy.*max_queue"):
            engine.generate("Hey", max_new_tokens=4)
        running.close()
        list(queued)                                                  # it runs once the first has ended
        assert len(queued.result.token_ids) == 4
        assert len(engine.generate("Hey", max_new_tokens=4).token_ids) == 4   # and the engine serves on
        assert engine.get_info()["requests"]["busy"] == 1


def test_a_request_cancelled_before_it_runs_never_runs(engine, references):
    before = _cancelled(engine)
    running = engine.stream(PROMPTS[0], max_new_tokens=2000)
    assert next(running)
    queued = engine.stream(PROMPTS[1], max_new_tokens=24)          # waits behind the running one
    engine.cancel(queued.request_id)
    assert list(queued) == [] and queued.result.finish_reason == "cancelled" and queued.result.token_ids == []
    running.close()
    assert engine.generate(PROMPTS[1], max_new_tokens=24).token_ids == references[str(PROMPTS[1])]
    assert _cancelled(engine) == before + 2


# ---- the CLI ----------------------------------------------------------------------------------

def test_cli_one_shot_json(tmp_path, engine):
    toml = write_toml(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "hetspec.cli", toml, "--prompt", "Hello CLI", "--json",
                             "--max-new-tokens", "17"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    out = json.loads(stdout)
    assert len(out["token_ids"]) == 17
    assert out["finish_reason"] == "length"
    assert out["stats"]["new_tokens"] == 17
    # same models, same greedy decoding: the same tokens as the engine in this process
    assert out["token_ids"] == engine.generate("Hello CLI", max_new_tokens=17).token_ids
    assert cli_leftovers(proc.pid) == ([], [], [])


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=FULL), signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_serve_mode(tmp_path, engine, sig):
    proc, endpoint, engine_processes = start_serving(write_toml(tmp_path))
    try:
        client = hetspec.connect(endpoint)
        result = client.generate("Hello server", max_new_tokens=12)
        assert result.token_ids == engine.generate("Hello server", max_new_tokens=12).token_ids

        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "serving" in stderr
    assert_exit(engine_processes)
    assert cli_leftovers(proc.pid) == ([], [], [])
    assert not os.path.exists(os.path.dirname(endpoint[len("ipc://"):]))
    # a client of the stopped engine is told so, rather than waiting forever
    _, error = call_within(DEADLINE_S, client.generate, "Hello server", max_new_tokens=4)
    assert isinstance(error, EngineDeadError), error
    client.close()


def test_cli_serve_mode_killed_mid_request(tmp_path):
    """A launcher killed outright (SIGKILL: no handler runs) takes its engine with it: the
    workers and the scheduler notice they are orphaned, stop, and remove every segment and
    the runtime directory; a client streaming at that moment gets an error, not a hang."""
    proc, endpoint, engine_processes = start_serving(write_toml(tmp_path), stderr=subprocess.DEVNULL)
    try:
        assert cli_leftovers(proc.pid)[0], "the engine made no shared-memory segments"
        client = hetspec.connect(endpoint)
        thread, box = start_long_request(client)
        proc.kill()
        proc.wait(DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_exit(engine_processes)
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the request hung after its engine's launcher was killed"
    assert "result" not in box, "a 2000-token request finished although its engine was killed"
    assert isinstance(box["error"], HetspecError), box
    client.close()
    assert cli_leftovers(proc.pid) == ([], [], [])

def test_cli_one_shot_interrupted(tmp_path):
    """Ctrl-C during a one-shot generation stops it (and the engine) instead of being ignored."""
    toml = write_toml(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "hetspec.cli", toml, "--prompt", "Hello", "--max-new-tokens", "3000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: first.put(proc.stdout.read(1)), daemon=True).start()
        try:
            assert first.get(timeout=CLI_TIMEOUT_S), "hetspec-launch exited without output"
        except queue.Empty:
            pytest.fail("hetspec-launch streamed nothing")
        engine_processes = psutil.Process(proc.pid).children(recursive=True)
        assert len(engine_processes) >= 3
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert b"Traceback" not in stderr
    assert_exit(engine_processes)
    assert cli_leftovers(proc.pid) == ([], [], [])
