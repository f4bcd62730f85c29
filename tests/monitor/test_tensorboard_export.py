"""``probe monitor export --tensorboard``: the stored series as TensorBoard event files.

The files are read back two ways: as TFRecords of ``Event`` messages decoded with protobuf
message classes built here from TensorBoard's field numbers (``event.proto``, ``summary.proto``),
CRCs checked; and, where the ``tensorboard`` package is installed, with TensorBoard's own
``EventAccumulator``.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

from probe.monitor.agent.monitor_agent import MonitorAgent
from probe.monitor.client import MonitorClient
from probe.monitor.numerics_names import metric_name
from probe.monitor.service.tensorboard_export import masked_crc32c
from tests.conftest import run_probe

from .conftest import wait_for

MODULES = ("layers.0.mlp", "layers.1.attn")
STEPS = 6


def event_class():
    """``Event`` with ``Summary``/``Summary.Value`` (tag, simple_value), from TensorBoard's
    field numbers."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="tb_event_check.proto", package="tbcheck",
                                             syntax="proto3")
    summary = fdp.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tbcheck.Summary.Value")
    event = fdp.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tbcheck.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tbcheck.Event"))


def read_scalars(path: Path) -> tuple[list, dict[str, dict[int, float]]]:
    """(the events, {tag: {step: value}}) of one event file; every record's CRCs checked."""
    Event = event_class()
    data = path.read_bytes()
    events, scalars, at = [], {}, 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8:at + 12])[0] == masked_crc32c(header)
        body = data[at + 12:at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == masked_crc32c(body)
        at += 16 + length
        event = Event.FromString(body)
        events.append(event)
        for v in event.summary.value:
            scalars.setdefault(v.tag, {})[event.step] = v.simple_value
    return events, scalars


def expected(rank: int, step: int) -> dict[str, float]:
    metrics = {"loss": 2.0 - 0.1 * step + rank, "step_time_ms": 40.0 + step}
    for i, module in enumerate(MODULES):
        metrics[metric_name(module, "grad_norm")] = 0.5 * (i + 1) + 0.01 * step + rank
        metrics[metric_name(module, "nonfinite")] = 0.0
    return metrics


@pytest.fixture
def fed(service, tmp_path):
    """Two ranks of job ``tb`` have sent STEPS steps of step metrics and numerics."""
    agents = [MonitorAgent(service.address, job="tb", rank=r, world_size=2, sample_host=False,
                           spool_path=str(tmp_path / f"r{r}.spool"), flush_interval_s=0.02)
              for r in (0, 1)]
    for agent in agents:
        agent.start()
    for step in range(STEPS):
        for agent in agents:
            agent.record(step, expected(agent.rank, step))
    for agent in agents:
        agent.close()
    client = MonitorClient(service.address)
    wait_for(lambda: client.metrics("tb").num_rows == 2 * STEPS * 6, what="every point stored")
    return service


def check_runs(out: Path) -> None:
    for rank in (0, 1):
        files = list((out / "tb" / f"rank{rank}").glob("events.out.tfevents.*"))
        assert len(files) == 1, files
        events, scalars = read_scalars(files[0])
        assert events[0].file_version == "brain.Event:2"
        assert sorted(scalars) == sorted(
            ["step/loss", "step/step_time_ms"]
            + [f"numerics/{m}/{q}" for m in MODULES for q in ("grad_norm", "nonfinite")])
        for step in range(STEPS):
            want = expected(rank, step)
            assert math.isclose(scalars["step/loss"][step], want["loss"], rel_tol=1e-6)
            got = scalars["numerics/layers.1.attn/grad_norm"][step]
            assert math.isclose(got, want[metric_name("layers.1.attn", "grad_norm")], rel_tol=1e-6)
        assert [e.step for e in events[1:]] == list(range(STEPS))   # one event per step
        assert all(e.wall_time > 1e9 for e in events)               # the points' own times


def test_export_from_a_running_service_and_from_its_store_file(fed, tmp_path):
    res = run_probe("monitor", "export", "--addr", fed.address, "--tensorboard", str(tmp_path / "tb"))
    assert res.returncode == 0, res.stderr
    assert "tb rank 1: 36 points, 6 tags" in res.stdout
    check_runs(tmp_path / "tb")
    fed.stop(grace=0)                                  # the store file is free now
    res = run_probe("monitor", "export", "--store", str(fed.store.path), "--job", "tb",
                    "--tensorboard", str(tmp_path / "tb2"))
    assert res.returncode == 0, res.stderr
    check_runs(tmp_path / "tb2")


def test_service_pages_are_joined_without_losing_or_doubling_a_point(fed):
    from probe.monitor.service.tensorboard_export import points_from_service

    client = MonitorClient(fed.address)
    table = points_from_service(client, "tb", page_rows=7)
    assert table.num_rows == 2 * STEPS * 6
    keys = {(r["rank"], r["step"], r["name"]) for r in table.to_pylist()}
    assert len(keys) == table.num_rows


def test_tensorboard_reads_the_files(fed, tmp_path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from probe.monitor.service.tensorboard_export import export_points, points_from_service

    export_points(points_from_service(MonitorClient(fed.address)), tmp_path / "tb")
    ea = accumulator.EventAccumulator(str(tmp_path / "tb" / "tb" / "rank1"))
    ea.Reload()
    assert "numerics/layers.0.mlp/grad_norm" in ea.Tags()["scalars"]
    values = [(e.step, round(e.value, 4)) for e in ea.Scalars("step/loss")]
    assert values == [(s, round(expected(1, s)["loss"], 4)) for s in range(STEPS)]
