"""Sessions: schedules and step selections, built-in ranges, sinks (store, trace, OTel)."""

from __future__ import annotations

import json

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from probe.collectors.store import StoreWriter, open_store
from probe.engine_adapter.base import get_adapter
from probe.engine_adapter.steps import StepSource
from probe.profiler import mstx, profile
from probe.profiler.engine_callbacks import ProfileCallback
from probe.profiler.session import Session
from tests.profiler.trace_schema import trace_problems


def run_steps(session, n, body=None):
    with session:
        for i in range(n):
            with mstx.range(f"work {i}", domain="user"):
                if body:
                    body(i)
            session.step()
    return session.report


def test_schedule_keeps_only_active_steps_like_torch_profiler(tmp_path):
    # wait 1, warmup 1, active 2, repeat 2: cycles of 4 steps -> active 2,3 and 6,7
    s = profile(tmp_path, schedule=(1, 1, 2, 2), store=True)
    report = run_steps(s, 10)
    assert report.steps == [2, 3, 6, 7]
    rows = open_store(tmp_path).sql("select step, name from events order by host_start_ns").fetchall()
    assert rows == [(2, "work 2"), (3, "work 3"), (6, "work 6"), (7, "work 7")]
    assert [s.state_of(i) for i in range(5)] == ["off", "warmup", "active", "active", "off"]


def test_step_selection_records_exactly_those_steps_and_ranges_open_at_pause_get_their_end(tmp_path):
    s = Session(tmp_path, steps=[1, 3], store=False, trace=False, sinks=[collect := _Collect()])
    with s:
        for i in range(5):
            rid = mstx.range_start(f"step {i}", domain="step")
            s.step()                       # the step's range ends after the boundary
            mstx.range_end(rid, domain="step")
    assert [(e.name, e.step, e.kind) for e in collect.events] == [("step 1", 1, "step"),
                                                                    ("step 3", 3, "step")]
    assert not s.report.problems


def test_what_recording_dropped_is_in_the_report_the_trace_metadata_and_the_store(tmp_path):
    with Session(tmp_path, overflow="drop", max_buffer=100, interval_s=60) as s:
        for _ in range(1000):
            mstx.mark("m")
    report = s.report
    assert (report.events, report.dropped, report.problems) == (100, 900, {})
    assert report.summary() == "rank 0: 100 events over steps 0-0; 900 mstx records dropped (overflow drop)"
    trace = json.loads((tmp_path / "trace" / "rank0.json").read_text())
    assert trace_problems(trace) == []
    (label,) = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_labels"]
    assert label["args"]["mstx_dropped_records"] == 900 and label["args"]["mstx_overflow"] == "drop"
    assert label["args"]["labels"] == "mstx: 900 records dropped (overflow drop)"
    con = open_store(tmp_path)
    assert con.sql("select step, value from metrics where name = 'mstx_dropped_records'").fetchall() == [(0, 900.0)]


def test_by_default_the_trace_says_recording_lost_nothing(tmp_path):
    with Session(tmp_path, store=False, max_buffer=100, interval_s=60) as s:
        for _ in range(1000):
            mstx.mark("m")
    assert (s.report.events, s.report.dropped, s.report.overflow) == (1000, 0, "block")
    trace = json.loads((tmp_path / "trace" / "rank0.json").read_text())
    (label,) = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_labels"]
    assert label["args"]["labels"] == "mstx: no record lost (overflow block)"
    assert label["args"]["mstx_dropped_records"] == 0


def test_trace_fragment_is_valid_chrome_json_with_overlaps_made_async(tmp_path):
    def body():
        a = mstx.range_start("a")
        b = mstx.range_start("b")
        mstx.range_end(a)              # a and b overlap without nesting
        mstx.range_end(b)
        mstx.mark("instant")

    with Session(tmp_path, store=False) as s:
        body()
    trace = json.loads((tmp_path / "trace" / "rank0.json").read_text())
    assert trace_problems(trace) == []
    phases = sorted(e["ph"] for e in trace["traceEvents"] if e["ph"] != "M")
    assert phases == ["X", "b", "e", "i"]
    assert s.report.trace_path.endswith("rank0.json")


def test_otel_sink_exports_spans_with_parents_attributes_and_epoch_times(tmp_path):
    exporter = InMemorySpanExporter()
    with Session(None, otel_exporter=exporter, otel_processor="simple"):
        with mstx.range("step 0", domain="step"):
            with mstx.range("forward", domain="engine"):
                mstx.mark("inside", domain="engine")
    spans = {sp.name: sp for sp in exporter.get_finished_spans()}
    assert set(spans) == {"step 0", "forward", "inside"}
    assert spans["forward"].parent.span_id == spans["step 0"].context.span_id
    assert spans["inside"].parent.span_id == spans["forward"].context.span_id
    assert spans["forward"].attributes["probe.domain"] == "engine"
    assert spans["step 0"].attributes["probe.kind"] == "step"
    assert spans["step 0"].resource.attributes["probe.rank"] == 0
    import time
    assert abs(spans["step 0"].start_time - time.time_ns()) < 60e9


def test_a_failing_sink_is_reported_and_the_others_still_get_events(tmp_path):
    class Broken:
        def open(self, meta): pass
        def write(self, events): raise OSError("disk full")
        def close(self): pass

    good = _Collect()
    with Session(None, sinks=[Broken(), good], store=False) as s:
        mstx.mark("m")
    assert [e.name for e in good.events] == ["m"]
    assert "disk full" in s.report.summary()


def test_optimizer_steps_dataloader_fetches_and_checkpoint_saves_become_ranges(tmp_path):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(6, 4)), batch_size=2)
    store = StoreWriter(tmp_path, rank=0)
    profiling = ProfileCallback(trace=False, flops=False, step_ranges=True)
    with StepSource(get_adapter("torch"), [profiling], str(tmp_path), store=store):
        for (x,) in data:
            model(x).sum().backward()
            opt.step()
        torch.save(model.state_dict(), tmp_path / "ck.pt")
    store.close()
    kinds = open_store(tmp_path).sql("select domain, name, step from events order by host_start_ns").fetchall()
    assert [k for k in kinds if k[0] == "step"] == [("step", "step 0", 0), ("step", "step 1", 1),
                                                     ("step", "step 2", 2)]
    assert [k for k in kinds if k[0] == "dataloader"][:3] == [("dataloader", "fetch", 0),
                                                             ("dataloader", "fetch", 1),
                                                             ("dataloader", "fetch", 2)]
    assert ("checkpoint", "torch.save", 3) in kinds
    assert torch.save.__module__ == "torch.serialization"        # patches are undone


def test_only_one_session_records_at_a_time(tmp_path):
    with Session(None, store=False):
        with pytest.raises(RuntimeError, match="already recording"):
            Session(None, store=False).start()
    assert not mstx.is_recording()


def test_bad_schedule_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="wait, warmup, active, repeat"):
        Session(None, schedule=(1, 1, 0, 1))


def test_torch_profiler_op_activity_lands_in_the_same_trace_on_our_clock(tmp_path):
    x = torch.randn(32, 32)
    with Session(tmp_path, torch_ops=True):
        with mstx.range("matmuls", domain="user"):
            for _ in range(3):
                x @ x
    trace = json.loads((tmp_path / "trace" / "rank0.json").read_text())
    assert trace_problems(trace) == []
    ours = next(e for e in trace["traceEvents"] if e.get("name") == "matmuls")
    mms = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert len(mms) == 3
    slack_us = 2000
    for mm in mms:
        assert ours["ts"] - slack_us <= mm["ts"] <= ours["ts"] + ours["dur"] + slack_us
    rows = open_store(tmp_path).sql("""select domain, kind, step from events
                                       where name = 'aten::mm'""").fetchall()
    assert rows == [("torch.cpu_op", "range", 0)] * 3


class _Collect:
    def __init__(self):
        self.events = []

    def open(self, meta):
        self.meta = meta

    def write(self, events):
        self.events.extend(events)

    def close(self):
        self.events.sort(key=lambda e: e.start_ns)


def test_otel_batch_export_of_many_spans_drops_none():
    exporter = InMemorySpanExporter()
    with Session(None, otel_exporter=exporter):          # the default batch span processor
        for i in range(5000):
            mstx.range_end(mstx.range_start(f"r{i}"))
    assert len(exporter.get_finished_spans()) == 5000


def test_device_times_get_one_track_per_device_and_stream_and_stay_valid_when_overlapping():
    from probe.collectors.perfetto import to_trace_events
    from probe.profiler.events import Event

    def ev(name, t0, t1, d0, d1, stream):
        return Event("user", name, "range", t0, t1, 1, 1, d0, d1, {"device": 0, "stream": stream}, 0)

    events = [ev("a", 0, 10, 100, 300, 7), ev("b", 20, 30, 200, 400, 7),   # overlap on stream 7
              ev("c", 40, 50, 150, 160, 9)]
    trace = {"traceEvents": to_trace_events(events, pid=0, thread_names={1: "MainThread"})}
    assert trace_problems(trace) == []
    names = sorted(e["args"]["name"] for e in trace["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "thread_name")
    assert names == ["MainThread", "device 0 stream 7", "device 0 stream 9"]
    device = [e for e in trace["traceEvents"] if e["ph"] != "M" and e["tid"] >= 1_000_000]
    assert sorted(e["ph"] for e in device) == ["X", "X", "b", "e"]
