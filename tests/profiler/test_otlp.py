"""OTLP export of the profiler's spans, to a real receiver: streamed while the run goes, nested.

The receiver (:mod:`tests.profiler.otlp_receiver`) serves the official OTLP collector services
(gRPC) or ``/v1/traces`` (HTTP/protobuf) on 127.0.0.1; the exporter under test is the official
one, configured only by the standard ``OTEL_EXPORTER_OTLP_*`` variables.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from probe.profiler import mstx
from probe.profiler.events import emit_complete
from probe.profiler.session import Session
from tests.conftest import run_probe

ROOT = Path(__file__).resolve().parents[2]


def _receiver(monkeypatch, kind: str, on_export=None):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from tests.profiler.otlp_receiver import GrpcReceiver, HttpReceiver

    receiver = (GrpcReceiver if kind == "grpc" else HttpReceiver)(on_export)
    for k, v in receiver.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")     # export every 50 ms, not 5 s
    return receiver


@pytest.fixture
def grpc_receiver(monkeypatch):
    receiver = _receiver(monkeypatch, "grpc")
    yield receiver
    receiver.stop()


@pytest.fixture
def http_receiver(monkeypatch):
    receiver = _receiver(monkeypatch, "http")
    yield receiver
    receiver.stop()


def _named(spans, name, step=None):
    found = [s for s in spans if s["name"] == name and (step is None or s["attributes"].get("probe.step") == step)]
    assert len(found) == 1, (name, step, [(s["name"], s["attributes"].get("probe.step")) for s in spans])
    return found[0]


def _one_step(step: int, wait_inside=None) -> None:
    with mstx.range(f"step {step}", domain="step"):
        with mstx.range("forward", domain="engine"):
            with mstx.range("attention", domain="user"):
                pass
        mstx.mark("loss ready", domain="engine")
        t0 = time.perf_counter_ns()
        emit_complete("all_reduce", "communication", t0, time.perf_counter_ns(),
                      {"op": "all_reduce", "group_size": 1, "bytes": 64})
        if wait_inside is not None:
            wait_inside()


def test_spans_stream_over_grpc_while_the_session_runs_nested_under_their_step(grpc_receiver):
    seen_while_open: list[str] = []

    def forward_arrives_while_step_1_is_open():
        grpc_receiver.wait(lambda r: any(s["name"] == "forward" and s["attributes"]["probe.step"] == 1
                                         for s in r.spans), what="forward of step 1")
        seen_while_open.append("forward")

    with Session(None, store=False, trace=False, otel_exporter="otlp", run="job-a") as s:
        _one_step(0)
        s.step()
        # streaming: step 0 reaches the collector while the session still records
        grpc_receiver.wait(lambda r: any(sp["name"] == "step 0" for sp in r.spans), what="step 0")
        _one_step(1, wait_inside=forward_arrives_while_step_1_is_open)
        s.step()
    assert seen_while_open == ["forward"]       # a child exported before its parent ended
    spans = grpc_receiver.spans
    assert len(spans) == 10 and s.report.sink_errors == []
    for step in (0, 1):
        root = _named(spans, f"step {step}", step)
        forward, attention = _named(spans, "forward", step), _named(spans, "attention", step)
        mark, comm = _named(spans, "loss ready", step), _named(spans, "all_reduce", step)
        assert root["parent_span_id"] == "" and root["attributes"]["probe.kind"] == "step"
        assert forward["parent_span_id"] == root["span_id"]
        assert attention["parent_span_id"] == forward["span_id"]
        assert mark["parent_span_id"] == root["span_id"] and mark["attributes"]["probe.kind"] == "mark"
        assert comm["parent_span_id"] == root["span_id"]
        assert comm["attributes"]["probe.kind"] == "comm"
        assert (comm["attributes"]["probe.op"], comm["attributes"]["probe.bytes"]) == ("all_reduce", 64)
        assert {sp["trace_id"] for sp in (root, forward, attention, mark, comm)} == {root["trace_id"]}
        assert root["start"] <= forward["start"] <= attention["start"] <= attention["end"] <= root["end"]
        assert abs(root["start"] - time.time_ns()) < 60e9                  # Unix-epoch times
    assert _named(spans, "step 0")["trace_id"] != _named(spans, "step 1")["trace_id"]
    resource = spans[0]["resource"]
    assert resource["service.name"] == "probe"
    assert (resource["probe.rank"], resource["probe.world_size"]) == (0, 1)
    assert resource["probe.run"] == resource["probe.job"] == "job-a"
    assert {sp["scope"] for sp in spans} == {"probe.profiler"}
    assert forward["attributes"]["thread.name"] == "MainThread"


def test_spans_go_over_http_protobuf_to_v1_traces(http_receiver, monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    with Session(None, store=False, trace=False, otel_exporter="otlp", run="job-h") as s:
        _one_step(0)
        s.step()
        http_receiver.wait(lambda r: len(r.spans) >= 5, what="step 0's spans")
    assert http_receiver.paths[0] == ("/v1/traces", "application/x-protobuf")
    spans = http_receiver.spans
    root = _named(spans, "step 0")
    assert _named(spans, "forward")["parent_span_id"] == root["span_id"]
    assert _named(spans, "attention")["parent_span_id"] == _named(spans, "forward")["span_id"]
    assert root["resource"]["service.name"] == "trainer"


def test_a_range_still_open_at_the_end_is_exported_so_no_child_points_at_nothing(grpc_receiver):
    with Session(None, store=False, trace=False, otel_exporter="otlp") as s:
        outer = mstx.range_start("epoch", domain="user")
        with mstx.range("inner", domain="user"):
            pass
        grpc_receiver.wait(lambda r: r.spans, what="inner")           # exported, parent open
    spans = grpc_receiver.spans
    epoch, inner = _named(spans, "epoch"), _named(spans, "inner")
    assert inner["parent_span_id"] == epoch["span_id"] and epoch["attributes"]["probe.unclosed"] is True
    assert s.report.problems == {"unclosed_range": 1}
    mstx.range_end(outer, domain="user")


def test_a_collector_that_is_down_holds_nothing_up_and_the_loss_is_a_sink_error(monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from probe.monitor.service.server import free_port

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "256")       # would make the sink wait
    t0 = time.monotonic()
    with Session(None, store=False, trace=False, otel_exporter="otlp") as s:
        for step in range(4):
            for _ in range(500):
                mstx.mark("lost")
            s.step()
    assert time.monotonic() - t0 < 8                  # one exporter timeout, not one per batch
    assert any("2000 of 2000 spans failed to export to http://127.0.0.1:" in e
               for e in s.report.sink_errors), s.report.sink_errors


def test_without_the_exporter_installed_asking_for_otlp_is_one_line_that_says_what_to_install(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.startswith("opentelemetry.exporter"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
    """))
    env = {"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"}
    res = run_probe("profile", "--otel", "otlp", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "pip install 'probe-toolchain[otlp]'" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()                      # refused before any run


def test_nothing_of_opentelemetry_is_imported_until_otel_is_asked_for():
    code = ("import sys, profiler.session, profiler.engine_callbacks, profiler.mstx, "
            "probe.commands.profile, monitor.service.server; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_probe_profile_of_a_script_streams_its_step_spans_over_otlp_before_the_script_ends(
        tmp_path, monkeypatch):
    flag = tmp_path / "collector-got-spans"
    receiver = _receiver(monkeypatch, "grpc", on_export=flag.touch)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        import torch
        from probe.profiler import mstx
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        streamed = False
        for i in range(4):
            with mstx.range("compute", domain="user"):
                model(torch.randn(2, 8)).sum().backward()
            opt.step()
            if i == 1:            # the collector must have step 0 before the run goes on
                deadline = time.monotonic() + 20
                while not os.path.exists({str(flag)!r}) and time.monotonic() < deadline:
                    time.sleep(0.02)
                streamed = os.path.exists({str(flag)!r})
        print("streamed while running:", streamed)
    """))
    try:
        res = run_probe("profile", "--otel", "otlp", "--no-flops", "--out", str(tmp_path / "out"),
                        "--", str(script), env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
    finally:
        receiver.stop()
    assert res.returncode == 0, res.stderr
    assert "streamed while running: True" in res.stdout
    spans = receiver.spans
    for step in range(4):
        root = _named(spans, f"step {step}", step)
        compute = _named(spans, "compute", step)
        assert root["parent_span_id"] == "" and compute["parent_span_id"] == root["span_id"]
        assert root["attributes"]["probe.source"] == "optimizer"
    assert spans[0]["resource"]["probe.run"] == "out"


def test_a_parent_open_across_a_clock_alignment_keeps_its_children():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    with Session(None, store=False, trace=False, otel_exporter=exporter, otel_processor="simple") as s:
        outer = mstx.range_start("train", domain="user")
        with mstx.range("setup", domain="user"):
            pass
        s._recorder.drain()                      # setup exported while train is open
        assert [sp.name for sp in exporter.get_finished_spans()] == ["setup"]
        # what Session._set_offset does after a script's init_process_group
        s._recorder.offset_ns = s.meta.clock_offset_ns = 1_000_000
        mstx.range_end(outer, domain="user")
    spans = {sp.name: sp for sp in exporter.get_finished_spans()}
    assert sorted(spans) == ["setup", "train"] and s.report.sink_errors == []
    assert spans["setup"].parent.span_id == spans["train"].context.span_id
    assert "probe.unclosed" not in spans["train"].attributes
