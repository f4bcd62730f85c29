"""Ranges given a CUDA stream get device timestamps (runs where CUDA is available)."""

from __future__ import annotations

import json

import pytest
import torch

from probe.profiler import mstx
from probe.profiler.session import Session
from tests.profiler.trace_schema import trace_problems

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_range_on_a_stream_gets_device_times_that_cover_its_kernels(tmp_path):
    stream = torch.cuda.Stream()
    x = torch.randn(2048, 2048, device="cuda")
    got = []

    class Sink:
        def open(self, meta): pass
        def write(self, events): got.extend(events)
        def close(self): pass

    with Session(tmp_path, store=False, sinks=[Sink()]):
        with torch.cuda.stream(stream):
            rid = mstx.range_start("matmuls", stream=stream, domain="user")
            for _ in range(20):
                x = x @ x / 2048
            mstx.range_end(rid, domain="user")          # returns before the kernels finish
            host_return = __import__("time").perf_counter_ns()
            mstx.mark("queued", stream=stream)
    (rng,) = [e for e in got if e.name == "matmuls"]
    (mark,) = [e for e in got if e.name == "queued"]
    assert rng.device_start_ns is not None and rng.device_end_ns > rng.device_start_ns
    assert rng.device_end_ns > rng.end_ns          # the device finished after the host returned
    assert rng.device_end_ns > host_return - 1_000_000
    assert mark.device_start_ns == mark.device_end_ns >= rng.device_end_ns - 1_000
    assert rng.payload["device"] == stream.device.index
    trace = json.loads((tmp_path / "trace" / "rank0.json").read_text())
    assert trace_problems(trace) == []
    device_tracks = [e for e in trace["traceEvents"]
                     if e.get("ph") == "M" and e["args"].get("name", "").startswith("device")]
    assert device_tracks


def test_flop_peak_of_a_known_gpu_is_looked_up():
    from probe.profiler.flops import PEAK_TFLOPS, peak_flops

    name = torch.cuda.get_device_name()
    if not any(model in name for model in PEAK_TFLOPS):
        pytest.skip(f"{name} is not in the peak table")
    assert peak_flops("cuda", torch.bfloat16) >= 100e12
