"""The scheduler's end of the draft link, over a real zmq pair and real shared
memory, with this test playing the draft worker: extensions that arrive after
the reply grow the likeliest branch; late ones of an earlier command are dropped;
what each draft cache holds is tracked from the commands and replies."""
import dataclasses
import os

import numpy as np
import pytest
import zmq

from hetspec.core.sampling import GREEDY
from hetspec.ipc import messages
from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import BranchPlan
from hetspec.ipc.shm import SharedArray, new_run_id, segment_name
from hetspec.scheduler.decoding.links import DraftLink, WorkerError


@pytest.fixture
def link_and_worker():
    context = zmq.Context()
    scheduler_end = Channel(context, "inproc://draft-link", bind=True)
    worker = Channel(context, "inproc://draft-link", bind=False)
    link = DraftLink("draft", scheduler_end)
    run_id = new_run_id()
    link.buffers = {"context": SharedArray.create(segment_name(run_id, "context"), (64,), np.int32),
                    "tokens": SharedArray.create(segment_name(run_id, "tokens"), (2, 16), np.int32),
                    "probs": SharedArray.create(segment_name(run_id, "probs"), (2, 16, 4), np.float32)}
    yield link, worker
    for buffer in link.buffers.values():
        buffer.close()
    scheduler_end.close()
    worker.close()
    context.term()


def _command(worker: Channel) -> messages.DraftWindow:
    command = worker.recv(2.0)
    assert isinstance(command, messages.DraftWindow)
    return command


def test_extensions_grow_the_last_branch(link_and_worker):
    link, worker = link_and_worker
    link.start_window(7, 0, [1, 2, 3], 4, GREEDY, BranchPlan("dynamic", 4, 0.8, extend_to=8))
    command = _command(worker)
    assert command.branches.extend_to == 8 and link.extending
    tokens = link.buffers["tokens"].array[command.slot]
    tokens[:6] = [20, 21, 30, 31, 32, 33]                 # an alternative, then the likeliest branch
    worker.send(messages.Drafted(7, command.slot, [2, 4], 0.01))
    for total in (7, 8):                                 # two more tokens before the verdict
        tokens[total - 1] = 34 + total - 7
        worker.send(messages.DraftExtended(command.command, command.slot, total, 0.01 * total))
    draft = link.finish_window()
    assert [b.tolist() for b in draft.branches] == [[20, 21], [30, 31, 32, 33, 34, 35]]
    assert draft.seconds == pytest.approx(0.08)


def test_late_extensions_of_an_earlier_command_are_dropped(link_and_worker):
    link, worker = link_and_worker
    link.start_window(7, 0, [1, 2, 3], 2, GREEDY, BranchPlan(1, 4, 0.8, extend_to=8))
    first = _command(worker)
    link.buffers["tokens"].array[first.slot, :2] = [5, 6]
    worker.send(messages.Drafted(7, first.slot, [2], 0.01))
    assert link.finish_window().branches[0].tolist() == [5, 6]
    link.start_window(7, 0, [1, 2, 3, 6], 2, GREEDY, BranchPlan(1, 4, 0.8, extend_to=8))
    second = _command(worker)
    # the worker was still extending the first command when the second arrived
    worker.send(messages.DraftExtended(first.command, first.slot, 3, 0.02))
    assert link.channel.socket.poll(2000)                # it has arrived ...
    assert not link.poll()                               # ... and is no reply
    link.buffers["tokens"].array[second.slot, :2] = [8, 9]
    worker.send(messages.Drafted(7, second.slot, [2], 0.01))
    assert link.finish_window().branches[0].tolist() == [8, 9]
    assert not link.busy


def test_settle_stops_an_extension_and_is_needed_only_once(link_and_worker):
    link, worker = link_and_worker
    link.start_window(7, 0, [1, 2, 3], 2, GREEDY, BranchPlan(1, 4, 0.8, extend_to=8))
    command = _command(worker)
    worker.send(messages.Drafted(7, command.slot, [2], 0.01))
    link.finish_window()
    link.settle()
    assert isinstance(worker.recv(2.0), messages.Idle)
    link.settle()
    assert worker.recv(0.1) is None
    link.start_window(7, 0, [1, 2, 3], 2, GREEDY)   # sequential: one plain sequence, no extension
    _command(worker)
    assert not link.extending


def test_what_each_draft_cache_holds_follows_its_commands_and_replies(link_and_worker):
    """DraftLink.held: a request's cache holds the context of its last command, or of a
    batch as far as the reply says it caught up; a failed batch's caches are read afresh;
    a draft with one cache shares it among all requests."""
    link, worker = link_and_worker
    run_id = new_run_id()
    link.buffers["contexts"] = SharedArray.create(segment_name(run_id, "contexts"), (4, 64), np.int32)
    link.buffers["drafts"] = SharedArray.create(segment_name(run_id, "drafts"), (4, 16), np.int32)
    link.hello = messages.WorkerHello("draft", os.getpid(), 4, "cpu", [0], 1, 0.0, caches=4)
    context = np.arange(1, 41, dtype=np.int32)
    link.start_window(7, 2, context, 2, GREEDY)
    assert _command(worker).cache == 2
    worker.send(messages.Drafted(7, 0, [2], 0.01))
    link.finish_window()
    assert link.ready(2, np.append(context, [5, 6])) and not link.ready(1, context)
    assert link.to_prefill(2, np.append(context[:10], [99] * 20), True) == 20
    windows = [messages.BatchWindow(8, 1, 40, GREEDY), messages.BatchWindow(7, 2, 42, GREEDY)]
    link.start_batch(windows, [context, np.append(context, [5, 6])], 3, 16)
    worker.recv(2.0)
    worker.send(messages.DraftedBatch([0, 3], [16, 42], 0.01))
    link.finish_batch()
    assert link.to_prefill(1, context, True) == 24 and not link.ready(1, context)
    assert link.to_prefill(2, np.append(context, [5, 6, 9]), True) == 1
    link.start_batch(windows, [context, np.append(context, [5, 6])], 3, 16)
    worker.recv(2.0)
    worker.send(messages.WorkerFailed("draft", "a pass failed", fatal=False))
    with pytest.raises(WorkerError):
        link.finish_batch()
    assert link.to_prefill(1, context, True) == link.to_prefill(2, context, True) == 40
    link.hello = dataclasses.replace(link.hello, caches=1)       # one cache for every request
    link.start_window(9, 3, context, 2, GREEDY)
    assert _command(worker).cache == 0 and link.ready(1, context)
    for key in ("contexts", "drafts"):
        link.buffers.pop(key).close()
