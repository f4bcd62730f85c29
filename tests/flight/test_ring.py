"""The flight recorder's ring: preallocated memory, the last K steps, and what it writes."""

from __future__ import annotations

import json
import math
import os
import signal
import tracemalloc

import pytest
import torch

from probe.dumper.flight import FlightRecorder, FlightRecorderStop
from probe.dumper.flight_ring import SLOT_BYTES, FlightRing
from probe.engine_adapter.base import get_adapter


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _step(net, x):
    net(x).pow(2).mean().backward()
    for p in net.parameters():
        p.grad = None


def test_the_ring_allocates_nothing_per_step_once_the_modules_are_known():
    net, x = _net(), torch.randn(8, 16)
    ring = FlightRing(get_adapter("torch"), steps=4)
    ring.attach(net)
    try:
        for step in range(3):                      # the first step finds the slots
            ring.begin_step(step)
            _step(net, x)
            ring.end_step()
        buffers = (ring.stats.ctypes.data, ring.numel.ctypes.data, ring.order.ctypes.data)
        capacity, slots = ring.capacity, ring.n_slots
        tracemalloc.start()
        try:
            for step in range(3, 8):                # warm the interpreter's caches
                ring.begin_step(step); _step(net, x); ring.end_step()
            before = tracemalloc.take_snapshot()
            for step in range(8, 58):
                ring.begin_step(step); _step(net, x); ring.end_step()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename")
                    if "flight_ring" in s.traceback[0].filename)
        assert (ring.stats.ctypes.data, ring.numel.ctypes.data, ring.order.ctypes.data) == buffers
        assert (ring.capacity, ring.n_slots) == (capacity, slots)
        assert grown < 4096, f"the ring's code kept {grown} bytes more after 50 steps"
        # forward outputs of 3 modules, the backward input and output gradients of the 3
        # (the first Linear's input needs no gradient), 4 parameter gradients
        assert slots == 3 + 5 + 4
        assert ring.nbytes == 4 * ring.capacity * (SLOT_BYTES + 1)
        assert [s for s, _ in ring.snapshot()] == [54, 55, 56, 57]
    finally:
        ring.detach()


def test_the_ring_holds_the_statistics_the_dump_would_write():
    net, x = _net(), torch.randn(8, 16)
    ring = FlightRing(get_adapter("torch"), steps=2)
    ring.attach(net)
    ring.begin_step(0)
    out = net(x)
    out.pow(2).mean().backward()
    ring.end_step()
    ring.detach()
    (step, data), = ring.snapshot()
    entry = data["Module.2.Linear.forward.0"]["output"][0]
    assert step == 0 and entry["shape"] == [8, 4]
    assert entry["Max"] == pytest.approx(out.max().item())
    assert entry["Norm"] == pytest.approx(out.norm().item(), rel=1e-6)
    grad = data["Module.0.Linear.parameters_grad.0"]["weight"][0]
    assert grad["Norm"] == pytest.approx(net[0].weight.grad.norm().item(), rel=1e-6)
    names = list(data)
    assert names.index("Module.2.Linear.forward.0") < names.index("Module.2.Linear.backward.0") \
        < names.index("Module.0.Linear.backward.0")


def test_a_script_recorder_writes_its_ring_when_the_loss_turns_nan_and_origin_names_it(tmp_path):
    from probe.compare.origin import find_origin

    net, x = _net(), torch.randn(8, 16)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)

    def poison(module, args, output):       # (before the recorder's hooks: it sees the NaN)
        return output * float("nan") if fr.ring.step == 5 else None

    net[1].register_forward_hook(poison)
    with FlightRecorder(net, steps=3, out=str(tmp_path)) as fr:
        for _ in range(7):
            loss = net(x).pow(2).mean()
            fr.observe(loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
    marker = json.loads((tmp_path / "flight_recorder" / "rank0.json").read_text())
    assert marker["trigger"] == "nonfinite" and marker["steps"] == [3, 4, 5]
    assert sorted(os.listdir(tmp_path / "step5" / "rank0")) == ["construct.json", "dump.json", "stack.json"]
    found = find_origin(tmp_path)
    assert (found["step"], found["rank"], found["module"], found["direction"], found["tensor"]) == \
        (5, 0, "1", "forward", "output.0")
    assert "NaN" in found["evidence"]


def test_an_exception_and_sigusr1_write_the_ring_and_stop_stops(tmp_path):
    net, x = _net(), torch.randn(8, 16)
    fr = FlightRecorder(net, steps=2, out=str(tmp_path / "sig"), auto_step=False).start()
    try:
        fr.step(); _step(net, x)
        os.kill(os.getpid(), signal.SIGUSR1)
        fr.step()
    finally:
        fr.stop()
    assert json.loads((tmp_path / "sig" / "flight_recorder" / "rank0.json").read_text())["trigger"] == "signal"
    assert signal.getsignal(signal.SIGUSR1) is not fr._on_signal

    with pytest.raises(ZeroDivisionError):
        with FlightRecorder(net, steps=2, out=str(tmp_path / "exc")):
            _step(net, x)
            1 / 0
    marker = json.loads((tmp_path / "exc" / "flight_recorder" / "rank0.json").read_text())
    assert marker["trigger"] == "exception" and "ZeroDivisionError" in marker["reason"]

    fr = FlightRecorder(net, steps=2, out=str(tmp_path / "stop"), auto_step=False, stop=True).start()
    try:
        with pytest.raises(FlightRecorderStop):
            for _ in range(10):
                _step(net, x)
                fr.step(loss=float("inf"))
    finally:
        fr.stop()


def test_a_spike_is_called_against_the_recent_history_only():
    from probe.dumper.flight_triggers import Triggers

    t = Triggers(ring_steps=4)
    losses = [5.0 - 0.05 * i for i in range(12)]
    assert all(t.check(i, [v, v + 0.1], 1.0) is None for i, v in enumerate(losses))
    spike = t.check(12, [4.4, 40.0], 1.0)
    assert spike.kind == "spike" and "rank 1" in spike.reason
    assert t.check(13, [4.3, 4.4], float("nan")).kind == "nonfinite"
    assert t.check(14, [4.3, 4.4], float("nan")) is None        # the same stretch: once


def test_faults_take_a_rank():
    from probe.engine.faults import parse_fault
    from probe.ground.errors import ProbeError

    f = parse_fault("nangrad:layers.1.mlp@2:6")
    assert (f.kind, f.target, f.rank, f.arg) == ("nangrad", "layers.1.mlp", 2, 6.0)
    assert parse_fault("scale:layers.0.mlp.down_proj.weight@1:1.5").rank == 1
    assert parse_fault("slow:1:3").rank is None
    with pytest.raises(ProbeError, match="not a rank number"):
        parse_fault("nan:layers.1.mlp@x:6")
    assert math.isclose(parse_fault("overflow:layers.0.attn@0:4").arg, 4)


def test_a_large_tensor_read_in_pieces_gives_the_kernels_statistics():
    import numpy as np

    from probe.engine_adapter.torch_stats import TorchStats

    ring = FlightRing(get_adapter("torch"), steps=1)
    ring.begin_step(0)
    stats = TorchStats()
    for t in (torch.randn(8, 128, 8192), torch.randn(100), torch.randn(70001, dtype=torch.float64)):
        t.view(-1)[7] = float("inf")
        t.view(-1)[-1] = float("nan") if t.numel() > 1000 else 0.0
        ring._record("x", 0, str(t.numel()), t)
        got = ring.stats[ring.row, ring._slot_of[("x", 0, str(t.numel()))]]
        assert np.allclose(got, stats.reduce(t, "float"), rtol=1e-9, equal_nan=True)
