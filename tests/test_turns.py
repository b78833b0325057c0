"""Requests at once (hetspec/scheduler/slots.py, batch.py): a short request is not kept
waiting behind a long one, and moving between a request alone and a batch, every round if
need be, changes no request's output. Nothing here asserts a wall-clock speed: only which
request finished first, and tokens."""
from __future__ import annotations

import threading
import time

import pytest

import hetspec

from helpers import WEAK_DRAFT, full_only, random_engine_config

DEADLINE_S = 120
LONG, SHORT = ("Hello", 2000), ("short one", 16)
# (prompt, parameters): every mode, greedy and seeded (keyed) sampling, a stop string, a weak draft's rests
REQUESTS = [
    ("The first", {"max_new_tokens": 120}),   # the longest: it ends alone, the draft caught up
    ("A second one", {"max_new_tokens": 50, "mode": "sequential"}),
    ("Third", {"max_new_tokens": 40, "mode": "target"}),
    ("Fourth, sampled", {"max_new_tokens": 50, "temperature": 0.8, "top_p": 0.9, "seed": 7}),
    ("Fifth, sampled", {"max_new_tokens": 50, "temperature": 1.0, "seed": 11, "mode": "sequential"}),
    ("Sixth", {"max_new_tokens": 45, "speculation": "auto"}),
]


def run_all(engine, requests) -> list:
    """Each request from its own thread, all at once; their Results in order."""
    results = [None] * len(requests)

    def one(i, prompt, params):
        results[i] = engine.generate(prompt, **params)

    threads = [threading.Thread(target=one, args=(i, *r), daemon=True) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return results


@pytest.mark.parametrize("draft", full_only("same", "weak", keep=["weak"]))
def test_switching_every_round_changes_no_output(draft):
    """turn_s so short that a request alone hands over after every round: each has its own
    cache in the target (a slot), requests step together, and the draft catches up with
    whichever request runs alone again."""
    config = random_engine_config(**({"draft": WEAK_DRAFT} if draft == "weak" else {}))
    config["server"] = {"turn_s": 0.001, "max_running": 4}   # 6 requests: 2 wait for a slot
    with hetspec.launch(config) as engine:
        alone = [engine.generate(prompt, **params) for prompt, params in REQUESTS]
        together = run_all(engine, REQUESTS)
        assert [r.token_ids for r in together] == [r.token_ids for r in alone]
        assert sum(r.stats["spec_rounds"] for r in together) > 0
        info = engine.get_info()
        assert info["running"] == 0 and info["requests"]["completed"] == 2 * len(REQUESTS)


@pytest.mark.parametrize("max_running", full_only(1, 4, keep=[1]))
def test_a_short_request_behind_a_long_one(max_running):
    """Stepped together (max_running 4, the default) the short request ends while the long one
    is still decoding; one at a time (max_running 1) it waits for all of the long one's tokens."""
    config = random_engine_config()
    config["server"] = {"max_running": max_running}
    with hetspec.launch(config) as engine:
        expected_long = engine.generate(LONG[0], max_new_tokens=LONG[1], mode="target").token_ids
        expected_short = engine.generate(SHORT[0], max_new_tokens=SHORT[1], mode="target").token_ids
        long = engine.stream(LONG[0], max_new_tokens=LONG[1])
        pieces = [next(long)]
        finished = {}
        reader = threading.Thread(target=lambda: (pieces.extend(long), finished.setdefault("long", len(finished))),
                                  daemon=True)
        reader.start()
        short = engine.generate(SHORT[0], max_new_tokens=SHORT[1])
        finished.setdefault("short", len(finished))
        reader.join(DEADLINE_S)
        assert not reader.is_alive()
        assert short.token_ids == expected_short and long.result.token_ids == expected_long
        assert (finished["short"] < finished["long"]) == (max_running > 1), finished


def test_a_request_waiting_for_its_turn_can_be_cancelled_or_time_out():
    config = random_engine_config()
    config["server"] = {"turn_s": 5.0}                      # the long request holds its turn for 5 s at a time
    with hetspec.launch(config) as engine:
        long = engine.stream(LONG[0], max_new_tokens=LONG[1])
        next(long)
        waiting = engine.stream(SHORT[0], max_new_tokens=SHORT[1])
        timed = engine.generate(SHORT[0], max_new_tokens=SHORT[1], timeout_s=0.5)
        assert timed.finish_reason == "timeout" and timed.token_ids == []
        engine.cancel(waiting.request_id)
        assert list(waiting) == [] and waiting.result.finish_reason == "cancelled"
        long.close()     # its cancel travels on the stream's own socket: get_info may arrive first
        deadline = time.monotonic() + 10
        while (counts := engine.get_info()["requests"])["cancelled"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counts["timeout"] == 1 and counts["cancelled"] == 2
