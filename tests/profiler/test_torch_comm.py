"""The torch.distributed wrapper: listeners see every collective once, with op, group size, bytes."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from probe.engine_adapter import torch_comm
from probe.profiler.session import Session


@pytest.fixture()
def gloo_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Calls:
    def __init__(self):
        self.started, self.ended = [], []

    def on_comm_start(self, call):
        self.started.append(call.op)

    def on_comm_end(self, call):
        self.ended.append((call.op, call.group_size, call.nbytes, call.end_ns >= call.start_ns))


def test_listeners_see_collectives_with_group_size_and_bytes(gloo_group):
    calls = torch_comm.add_listener(Calls())
    try:
        t = torch.ones(10, dtype=torch.float32)
        dist.all_reduce(t)
        out = [torch.empty(3, dtype=torch.float64)]
        dist.all_gather(out, torch.ones(3, dtype=torch.float64))
        dist.broadcast(t, src=0)
        dist.barrier()
    finally:
        torch_comm.remove_listener(calls)
    assert calls.started == ["all_reduce", "all_gather", "broadcast", "barrier"]
    assert calls.ended == [("all_reduce", 1, 40, True), ("all_gather", 1, 24, True),
                           ("broadcast", 1, 40, True), ("barrier", 1, None, True)]


def test_calls_inside_a_wrapped_call_are_not_reported_twice(gloo_group):
    calls = torch_comm.add_listener(Calls())
    try:
        out = [None]
        dist.all_gather_object(out, {"a": 1})     # runs all_gather inside
    finally:
        torch_comm.remove_listener(calls)
    assert out == [{"a": 1}]
    assert [c[0] for c in calls.ended] == ["all_gather_object"]


def test_removing_the_last_listener_restores_the_original_functions():
    original = dist.all_reduce
    listener = torch_comm.add_listener(Calls())
    assert dist.all_reduce is not original and dist.all_reduce.__wrapped__ is original
    torch_comm.remove_listener(listener)
    assert dist.all_reduce is original
    assert torch_comm.listeners() == ()


def test_a_failing_listener_is_removed_and_the_collective_still_runs(gloo_group, logged):
    class Broken:
        def on_comm_start(self, call):
            raise KeyError("boom")

    torch_comm.add_listener(Broken())
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.ones(2))
    assert torch_comm.listeners() == ()
    assert "Broken failed" in logged()


def test_a_session_records_communication_ranges_with_their_payload(gloo_group):
    got = []

    class Sink:
        def open(self, meta): pass
        def write(self, events): got.extend(events)
        def close(self): pass

    with Session(None, sinks=[Sink()], store=False):
        dist.all_reduce(torch.ones(8, dtype=torch.bfloat16))
    (ev,) = got
    assert (ev.domain, ev.name, ev.kind) == ("communication", "all_reduce", "comm")
    assert ev.payload == {"op": "all_reduce", "group_size": 1, "bytes": 16}
    assert torch_comm.listeners() == ()
