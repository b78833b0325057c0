"""The scheduler's end of the draft link, over a real zmq pair and real shared
memory, with this test playing the draft worker: extensions that arrive after
the reply grow the likeliest branch; late ones of an earlier command are dropped."""
import numpy as np
import pytest
import zmq

from hetspec.core.sampling import GREEDY
from hetspec.ipc import messages
from hetspec.ipc.channel import Channel
from hetspec.ipc.messages import BranchPlan
from hetspec.ipc.shm import SharedArray, new_run_id, segment_name
from hetspec.scheduler.decoding.links import DraftLink


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
