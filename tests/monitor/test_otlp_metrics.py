"""The monitor service exports the metrics it stores as OTLP metrics, to a real receiver."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from probe.monitor.proto import monitor_pb2 as pb
from probe.monitor.proto import monitor_pb2_grpc as pb_grpc
from probe.monitor.service.server import MonitorService
from tests.monitor.test_service import batch

from .conftest import wait_for


def _receiver(monkeypatch, kind: str):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from tests.profiler.otlp_receiver import GrpcReceiver, HttpReceiver

    receiver = (GrpcReceiver if kind == "grpc" else HttpReceiver)()
    for k, v in receiver.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")      # ms
    return receiver


def _latest(points, metric, rank):
    found = [p for p in points if p["metric"] == metric and p["attributes"].get("probe.rank") == rank]
    return found[-1] if found else None


def _push(address, job="j", ranks=(0, 1), steps=(0, 1, 2), seq=1):
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.MonitorStub(channel)
    for rank in ranks:
        agent = f"agent-{rank}"
        stub.Register(pb.RegisterRequest(job=job, rank=rank, world_size=len(ranks), agent_id=agent))
        stub.Push(batch(seq, list(steps), job=job, rank=rank, agent=agent))
    return channel, stub


def test_stored_metrics_reach_an_otlp_collector_with_rank_and_job_while_the_service_runs(
        tmp_path, monkeypatch):
    receiver = _receiver(monkeypatch, "grpc")
    svc = MonitorService(tmp_path / "m.duckdb", port=0, otlp=True)
    svc.start()
    try:
        channel, stub = _push(svc.address)
        # values: arange over (step, name) pairs -> loss 0, 2, 4; step_time_ms 1, 3, 5
        points = receiver.wait(lambda r: all(_latest(r.points, "probe.loss", k) for k in (0, 1))
                               and r.points, what="probe.loss of ranks 0 and 1")
        stub.Push(batch(1, [0, 1, 2], rank=0, agent="agent-0"))       # a resend: not counted again
        stub.Push(batch(2, [3], rank=0, agent="agent-0"))
        receiver.wait(lambda r: (_latest(r.points, "probe.step", 0) or {}).get("value") == 3,
                      what="rank 0 at step 3")
        channel.close()
    finally:
        svc.stop(grace=0)
    points = receiver.points
    for rank in (0, 1):
        loss = _latest(points, "probe.loss", rank)
        assert loss["kind"] == "gauge" and loss["attributes"] == {"probe.job": "j", "probe.rank": rank}
        assert _latest(points, "probe.step_time_ms", rank)["unit"] == "ms"
    assert _latest(points, "probe.loss", 1)["value"] == 4.0              # the last step's value
    assert _latest(points, "probe.loss", 0)["value"] == 0.0              # batch 2: step 3, value 0
    count, total = _latest(points, "probe.step_time", 0)["value"]
    assert (count, total) == (4, 1 + 3 + 5 + 1)                          # every step time, once
    assert _latest(points, "probe.monitor.points", 0)["value"] == 8       # 6 + 2, the resend not
    assert _latest(points, "probe.monitor.points", 1)["value"] == 6
    resource = points[0]["resource"]
    assert resource["service.name"] == "probe-monitor"
    assert resource["probe.monitor.address"].startswith("127.0.0.1:")
    receiver.stop()


def test_probe_monitor_serve_otlp_exports_over_http_protobuf(tmp_path, monkeypatch, serve):
    receiver = _receiver(monkeypatch, "http")
    try:
        proc = serve("--otlp")
        wait_for(lambda: any("exported over OTLP" in line for line in proc.log), timeout=10,
                 what="the OTLP line")
        channel, _ = _push(proc.addr, job="cli", ranks=(0,))
        got = receiver.wait(lambda r: _latest(r.points, "probe.loss", 0), what="probe.loss")
        channel.close()
        proc.stop()
    finally:
        receiver.stop()
    assert got["attributes"] == {"probe.job": "cli", "probe.rank": 0}
    assert ("/v1/metrics", "application/x-protobuf") in receiver.paths
    line = next(line for line in proc.log if "exported over OTLP" in line)
    assert f"{receiver.endpoint}/v1/metrics (http/protobuf) every 0.1 s" in line


def test_a_collector_that_is_down_costs_the_service_nothing_but_the_export(tmp_path, monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    from probe.monitor.client import MonitorClient
    from probe.monitor.service.server import free_port

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "50")
    svc = MonitorService(tmp_path / "m.duckdb", port=0, otlp=True)
    svc.start()
    try:
        channel, _ = _push(svc.address, ranks=(0,))
        wait_for(lambda: svc.otlp.exporter.failing, timeout=10, what="a failed export")
        assert MonitorClient(svc.address).metrics("j").num_rows == 6     # stored all the same
        channel.close()
    finally:
        started = time.monotonic()
        svc.stop(grace=0)
    assert time.monotonic() - started < 3           # no waiting out the exporter's retries


def test_serve_otlp_without_the_exporter_is_one_line_that_says_what_to_install(tmp_path):
    from tests.conftest import run_probe

    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('opentelemetry.exporter'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n")
    root = Path(__file__).resolve().parents[2]
    res = run_probe("monitor", "serve", "--otlp", "--port", "0", "--store", str(tmp_path / "m.duckdb"),
                    env={"PYTHONPATH": f"{blocker}{os.pathsep}{root}"}, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "pip install 'probe-toolchain[otlp]'" in res.stderr
    assert not (tmp_path / "m.duckdb").exists()
