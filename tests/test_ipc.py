"""The transport on its own: message schema, zmq channels, shared-memory lifecycle."""
import dataclasses
import os
import subprocess
import sys
import types
import typing

import numpy as np
import pytest
import zmq

from hetspec.core.sampling import GREEDY, Sampling
from hetspec.ipc import codec, messages
from hetspec.ipc.channel import Channel, Router, ipc_endpoint, make_runtime_dir
from hetspec.ipc.shm import SharedArray, new_run_id, remove_leftovers, segment_name


def _example(cls):
    """A message with every required field set to a value of its declared type."""
    values = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = typing.get_args(hint)[0]
        if typing.get_origin(hint) is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            values[f.name] = [_example(typing.get_args(hint)[0])] * 2      # VerifyBatch's commands
            continue
        values[f.name] = GREEDY if hint is Sampling else {
            int: 3, str: "x", float: 0.5, bool: True, dict: {"a": [1]}}.get(typing.get_origin(hint) or hint, [1, 2])
    return cls(**values)


@pytest.mark.parametrize("cls", codec.TYPES, ids=lambda c: c.__name__)
def test_every_message_round_trips(cls):
    message = _example(cls)
    assert codec.decode(codec.encode(message)) == message


def test_malformed_messages_are_rejected():
    with pytest.raises(codec.Malformed):
        codec.decode([b"\xff", b"{}"])
    with pytest.raises(codec.Malformed, match="unexpected fields"):
        codec.decode([codec.encode(messages.Shutdown())[0], b'{"surprise": 1}'])
    tag = codec.encode(messages.GenerateRequest(0))[0]
    with pytest.raises(codec.Malformed, match="prompt must be") as refused:
        codec.decode([tag, b'{"request_id": 7, "prompt": [1, 2.5]}'])
    assert refused.value.request_id == 7                  # so the client is answered about its own request
    with pytest.raises(codec.Malformed, match="request_id must be a 64-bit integer"):
        codec.decode([tag, b'{"request_id": 18446744073709551616}'])
    with pytest.raises(codec.Malformed, match="nested too deeply"):
        codec.decode([tag, b"[" * 100000])


def test_channel_and_router_over_ipc(tmp_path):
    runtime = make_runtime_dir(str(tmp_path / "run"))
    assert os.stat(runtime).st_mode & 0o777 == 0o700
    context = zmq.Context()
    router = Router(context, ipc_endpoint(runtime, "client"))
    a = Channel(context, router.endpoint, bind=False)
    b = Channel(context, router.endpoint, bind=False)
    a.send(messages.InfoRequest())
    b.send(messages.StopEngine())
    assert router.socket.poll(2000)
    got = {}
    while len(got) < 2:
        item = router.recv_nowait()
        if item is None:
            router.socket.poll(1000)
            continue
        got[type(item[1]).__name__] = item[0]
    router.send(got["InfoRequest"], messages.EngineInfo({"ok": True}))
    assert a.recv(2.0) == messages.EngineInfo({"ok": True})
    assert b.recv(0.1) is None                     # each client gets only its own replies
    for s in (a, b, router):
        s.close()
    context.term()


def test_shared_array_is_seen_by_another_process_and_unlinked_by_its_owner():
    run_id = new_run_id()
    owner = SharedArray.create(segment_name(run_id, "probe"), (4, 8), np.float32)
    owner.array[:] = np.arange(32).reshape(4, 8)
    name, shape, dtype = owner.spec()
    code = (
        "import sys, numpy as np; from hetspec.ipc.shm import SharedArray\n"
        f"a = SharedArray.attach({name!r}, {shape!r}, {dtype!r})\n"
        "a.array[0, 0] = -1.0; print(float(a.array.sum())); a.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) == pytest.approx(sum(range(32)) - 1)
    # the attaching process exited: the segment must still exist (no resource-tracker unlink)
    assert os.path.exists(f"/dev/shm/{name}")
    assert "leaked" not in out.stderr and "resource_tracker" not in out.stderr
    assert owner.array[0, 0] == -1.0
    owner.close()
    assert not os.path.exists(f"/dev/shm/{name}")


def test_leftovers_of_a_crashed_owner_are_removed():
    run_id = new_run_id()
    code = (
        "from hetspec.ipc.shm import SharedArray; import numpy as np, os\n"
        "from multiprocessing import resource_tracker\n"
        f"a = SharedArray.create('{segment_name(run_id, 'x')}', (16,), np.int32)\n"
        "resource_tracker.unregister(a._shm._name, 'shared_memory')\n"   # as if the tracker died too
        "os._exit(0)\n"   # dies without closing
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert remove_leftovers(run_id) == [segment_name(run_id, "x")]
    assert not any(n.startswith(segment_name(run_id, "")) for n in os.listdir("/dev/shm"))
