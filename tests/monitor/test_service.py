"""The service's protocol: exactly-once ingest, bad input refused, auth, status document, CLI."""

import json

import grpc
import numpy as np
import pytest

from probe.ground.errors import ProbeError
from probe.monitor import auth
from probe.monitor.client import MonitorClient
from probe.monitor.limits import MAX_BATCH_POINTS
from probe.monitor.proto import monitor_pb2 as pb
from probe.monitor.proto import monitor_pb2_grpc as pb_grpc
from probe.monitor.service.server import MonitorService, free_port
from tests.conftest import run_probe

from .conftest import wait_for


def batch(seq, steps, names=("loss", "step_time_ms"), job="j", rank=0, agent="agent-a", **kw):
    n_names = len(names)
    idx = np.tile(np.arange(n_names, dtype=np.int32), len(steps))
    st = np.repeat(np.asarray(steps, dtype=np.int64), n_names)
    return pb.MetricBatch(job=job, rank=rank, agent_id=agent, seq=seq, names=list(names),
                          name_index=idx.tobytes(), steps=st.tobytes(),
                          time_ns=np.full(len(st), 7, dtype=np.int64).tobytes(),
                          values=np.arange(len(st), dtype=np.float64).tobytes(), **kw)


@pytest.fixture
def stub(service):
    channel = grpc.insecure_channel(service.address)
    yield pb_grpc.MonitorStub(channel)
    channel.close()


def test_a_resent_batch_is_acknowledged_but_stored_once(service, stub):
    stub.Register(pb.RegisterRequest(job="j", rank=0, world_size=1, agent_id="agent-a"))
    first = stub.Push(batch(1, [0, 1, 2]))
    again = stub.Push(batch(1, [0, 1, 2]))
    assert (first.stored, first.duplicate) == (6, False)
    assert (again.stored, again.duplicate) == (0, True)
    stub.Push(batch(2, [3]))
    table = MonitorClient(service.address).metrics("j")
    assert table.num_rows == 8
    assert sorted(set(table.column("step").to_pylist())) == [0, 1, 2, 3]


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b.__setattr__("values", b.values[:-3]), "whole number of float64"),
    (lambda b: b.__setattr__("steps", b.steps[:-8]), "columns disagree"),
    (lambda b: b.__setattr__("name_index", np.int32([0, 9]).tobytes()), "outside the 2 names"),
    (lambda b: b.__setattr__("job", ""), "job must be"),
    (lambda b: b.__setattr__("rank", -1), "negative"),
])
def test_malformed_batches_are_refused_with_a_reason_and_nothing_is_stored(service, stub, mutate,
                                                                          message):
    bad = batch(1, [0])
    mutate(bad)
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert service.store.metrics().num_rows == 0


def test_oversized_batches_are_refused(service, stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(batch(1, range(MAX_BATCH_POINTS // 2 + 1)))
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
    big = pb.MetricBatch(job="j", rank=0, agent_id="a", seq=1, values=b"\0" * (9 << 20))
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(big)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_rank_that_registers_twice_replaces_its_old_agent(service, stub):
    one = stub.Register(pb.RegisterRequest(job="j", rank=1, world_size=2, agent_id="old", pid=1))
    two = stub.Register(pb.RegisterRequest(job="j", rank=1, world_size=2, agent_id="new", pid=2))
    assert not one.replaced and two.replaced
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.Commands(pb.CommandStreamRequest(job="j", rank=1, agent_id="old"))))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    ranks = MonitorClient(service.address).status()["jobs"][0]["ranks"]
    assert [(r["rank"], r["pid"], r["registrations"]) for r in ranks] == [(1, 2, 2)]


def test_register_with_a_rank_outside_the_world_is_refused(stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(pb.RegisterRequest(job="j", rank=4, world_size=4, agent_id="a"))
    assert "does not fit world size 4" in err.value.details()


def test_status_json_has_jobs_ranks_and_alerts_with_evidence(service, stub):
    for rank in range(4):
        stub.Register(pb.RegisterRequest(job="j", rank=rank, world_size=4, agent_id=f"a{rank}"))
    names = ("step_time_ms", "compute_time_ms", "comm_time_ms", "data_time_ms", "loss")
    for step in range(12):
        for rank in range(4):
            compute = 300.0 if rank == 3 else 100.0
            vals = np.float64([compute + 15.0 + 1, compute, 15.0 + 300.0 - compute, 1.0, 2.0])
            stub.Push(pb.MetricBatch(
                job="j", rank=rank, agent_id=f"a{rank}", seq=step + 1, names=list(names),
                name_index=np.arange(5, dtype=np.int32).tobytes(),
                steps=np.full(5, step, np.int64).tobytes(), time_ns=np.full(5, 1, np.int64).tobytes(),
                values=vals.tobytes()))
    wait_for(lambda: service.store.alerts().num_rows, what="an alert")
    doc = json.loads(run_probe("monitor", "status", "--json", "--addr", service.address).stdout)
    job = doc["jobs"][0]
    assert job["job"] == "j" and job["world_size"] == 4 and job["last_step"] == 11
    assert [r["rank"] for r in job["ranks"]] == [0, 1, 2, 3]
    assert all(r["health"] == "ok" and r["points"] == 60 for r in job["ranks"])
    alert = doc["alerts"][0]
    assert (alert["kind"], alert["rank"]) == ("straggler", 3)
    # three peers over a few steps: ten slow steps in a row are needed before the chance of it
    # under the noise they may have (Laplace-estimated, one standard error up) is below ALPHA
    assert alert["step"] <= 11 and alert["evidence"]["cause"] == "compute"
    text = run_probe("monitor", "status", "--addr", service.address).stdout
    assert "job j" in text and "straggler" in text


def test_names_from_the_network_reach_the_terminal_escaped(service, stub):
    evil_job, evil_host = "j\x1b[2J\x1b[31m", "h\x1b]0;owned\x07\u202e"
    stub.Register(pb.RegisterRequest(job=evil_job, rank=0, world_size=1, host=evil_host, pid=7,
                                      agent_id="a0"))
    stub.Push(batch(1, [0, 1], job=evil_job, agent="a0"))
    stub.UploadTrace(_chunks({"rank0.json": b"{}"}, job=evil_job))
    for args in (("status",), ("alerts",), ("trace-files",)):
        res = run_probe("monitor", *args, "--addr", service.address)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\u202e" not in res.stdout, res.stdout
    status = run_probe("monitor", "status", "--addr", service.address).stdout
    assert "job j\\x1b[2J\\x1b[31m" in status and "h\\x1b]0;owned\\x07\\u202e:7" in status
    assert "j\\x1b[2J" in run_probe("monitor", "trace-files", "--addr", service.address).stdout


def test_status_without_a_service_is_one_clear_line():
    res = run_probe("monitor", "status", "--addr", f"127.0.0.1:{free_port()}")
    assert res.returncode == 2
    assert "no monitor service answers" in res.stderr and "Traceback" not in res.stderr


def test_a_non_loopback_bind_needs_a_token(tmp_path):
    with pytest.raises(ProbeError, match="needs a token"):
        MonitorService(tmp_path / "m.duckdb", host="0.0.0.0", port=0)
    res = run_probe("monitor", "serve", "--host", "0.0.0.0", "--port", "0",
                    "--store", str(tmp_path / "m.duckdb"), env={"PROBE_MONITOR_TOKEN": ""})
    assert res.returncode == 2 and "needs a token" in res.stderr


def test_with_a_token_every_call_without_it_is_refused(tmp_path):
    svc = MonitorService(tmp_path / "m.duckdb", host="127.0.0.1", port=0, token="s3cret")
    svc.start()
    try:
        channel = grpc.insecure_channel(svc.address)
        stub = pb_grpc.MonitorStub(channel)
        for call, request in ((stub.Push, batch(1, [0])),
                              (stub.RequestTrace, pb.TraceRequest(job="j", next_steps=1)),
                              (stub.Status, pb.StatusRequest())):
            with pytest.raises(grpc.RpcError) as err:
                call(request, metadata=auth.token_metadata("wrong"))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "PROBE_MONITOR_TOKEN" in err.value.details()
        with pytest.raises(grpc.RpcError):
            next(iter(stub.Commands(pb.CommandStreamRequest(job="j", rank=0, agent_id="a"))))
        assert svc.store.metrics().num_rows == 0
        ok = stub.Push(batch(1, [0]), metadata=auth.token_metadata("s3cret"))
        assert ok.stored == 2
        res = run_probe("monitor", "trace", "--addr", svc.address, "--job", "j", "--next", "2",
                        env={"PROBE_MONITOR_TOKEN": ""})
        assert res.returncode == 2 and "missing or wrong token" in res.stderr
        assert MonitorClient(svc.address, token="s3cret").status()["service"]["auth"] is True
        channel.close()
    finally:
        svc.stop(grace=0)


def test_trace_request_for_an_unknown_job_says_so(service):
    with pytest.raises(ProbeError, match="no registered ranks"):
        MonitorClient(service.address).request_trace("nope", steps="3-4")
    with pytest.raises(ProbeError, match="FIRST-LAST"):
        MonitorClient(service.address).request_trace("nope", steps="5-2")


def test_a_rank_that_stops_sending_turns_lost_and_raises_an_alert(tmp_path):
    svc = MonitorService(tmp_path / "m.duckdb", port=0, detect_interval_s=0.05, lost_after_s=0.6)
    svc.start()
    try:
        channel = grpc.insecure_channel(svc.address)
        stub = pb_grpc.MonitorStub(channel)
        stub.Register(pb.RegisterRequest(job="j", rank=0, world_size=1, agent_id="agent-a", pid=42))
        stub.Push(batch(1, [0, 1]))
        alert = wait_for(lambda: svc.store.alerts(kind="rank_lost").to_pylist(), timeout=10,
                         what="rank_lost")[0]
        assert (alert["rank"], alert["step"]) == (0, 1)
        doc = MonitorClient(svc.address).status()
        assert doc["jobs"][0]["ranks"][0]["health"] == "lost"
        assert doc["jobs"][0]["health"] == "degraded"
        channel.close()
    finally:
        svc.stop(grace=0)


def test_tls_with_a_token_serves_clients_that_trust_the_certificate(tmp_path):
    import shutil
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    svc = MonitorService(tmp_path / "m.duckdb", port=0, token="t0k", tls_cert=str(cert),
                         tls_key=str(key))
    svc.start()
    try:
        doc = MonitorClient(svc.address, token="t0k", ca=str(cert)).status()
        assert doc["service"]["tls"] is True and doc["service"]["auth"] is True
        with pytest.raises(ProbeError):
            MonitorClient(svc.address, token="t0k", timeout=2).status()     # plaintext client
    finally:
        svc.stop(grace=0)


def test_watchers_get_alerts_as_they_are_raised(service, stub):
    import threading

    events = []
    client = MonitorClient(service.address)

    def watch():
        for event in client.watch("j", timeout=20):
            events.append(event)
            if event["type"] == "alert":
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    wait_for(lambda: events, what="the hello event")
    stub.Register(pb.RegisterRequest(job="j", rank=0, world_size=1, agent_id="agent-a"))
    nan = pb.MetricBatch(job="j", rank=0, agent_id="agent-a", seq=1, names=["loss"],
                         name_index=np.int32([0]).tobytes(), steps=np.int64([3]).tobytes(),
                         time_ns=np.int64([1]).tobytes(), values=np.float64([np.nan]).tobytes())
    stub.Push(nan)
    watcher.join(20)
    alert = events[-1]
    assert alert["type"] == "alert" and (alert["kind"], alert["rank"], alert["step"]) == ("nonfinite", 0, 3)
    assert "loss = nan" in alert["message"]


def test_serve_refuses_a_store_in_use_a_corrupt_store_and_a_busy_port(tmp_path, serve):
    first = serve()
    res = run_probe("monitor", "serve", "--port", "0", "--store", str(first.store))
    assert res.returncode == 2 and "another 'probe monitor serve'" in res.stderr
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database" * 100)
    res = run_probe("monitor", "serve", "--port", "0", "--store", str(junk))
    assert res.returncode == 2 and "cannot open the monitor store" in res.stderr
    res = run_probe("monitor", "serve", "--port", str(first.port), "--store",
                    str(tmp_path / "other.duckdb"))
    assert res.returncode == 2 and f"port {first.port} on 127.0.0.1 is in use" in res.stderr
    assert "--port 0" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1          # no gRPC log line before it
    assert not (tmp_path / "other.duckdb").exists()           # refused before the store is made


def test_after_a_restart_finished_ranks_stay_finished_and_alerts_are_not_repeated(tmp_path):
    store = tmp_path / "m.duckdb"
    svc = MonitorService(store, port=0, detect_interval_s=0.05)
    svc.start()
    channel = grpc.insecure_channel(svc.address)
    stub = pb_grpc.MonitorStub(channel)
    stub.Register(pb.RegisterRequest(job="j", rank=0, world_size=1, agent_id="agent-a"))
    stub.Push(pb.MetricBatch(job="j", rank=0, agent_id="agent-a", seq=1, names=["loss"],
                             name_index=np.int32([0]).tobytes(), steps=np.int64([3]).tobytes(),
                             time_ns=np.int64([1]).tobytes(), values=np.float64([np.inf]).tobytes(),
                             final=True))
    wait_for(lambda: svc.store.alerts().num_rows, what="the alert")
    channel.close()
    svc.stop(grace=0)
    again = MonitorService(store, port=0, detect_interval_s=600)
    again.start()
    try:
        doc = MonitorClient(again.address).status()
        assert doc["jobs"][0]["ranks"][0]["health"] == "finished"
        channel = grpc.insecure_channel(again.address)
        stub = pb_grpc.MonitorStub(channel)
        stub.Register(pb.RegisterRequest(job="j", rank=0, world_size=1, agent_id="agent-b"))
        stub.Push(batch(1, [4], names=("loss",), agent="agent-b"))
        assert again.detect_once() == []          # step 3's alert is not raised a second time
        assert [a["kind"] for a in MonitorClient(again.address).status()["alerts"]] == ["nonfinite"]
        channel.close()
    finally:
        again.stop(grace=0)


def _chunks(files, trace_id="t1", job="j", rank=0, cut=None):
    """An upload stream of ``files`` ({name: bytes}); ``cut``: stop inside that file."""
    common = dict(trace_id=trace_id, job=job, rank=rank, start_step=3, end_step=4)
    for name, data in files.items():
        half = len(data) // 2
        yield pb.TraceChunk(filename=name, data=data[:half], last=False, **common)
        if name == cut:
            return
        yield pb.TraceChunk(filename=name, data=data[half:], last=True, **common)


def test_a_trace_upload_is_recorded_whole_and_a_resent_one_replaces_it(service, stub):
    files = {"rank0.json": b'{"traceEvents": []}', "store/seg.parquet": b"PAR1" * 100}
    stub.UploadTrace(_chunks(files))
    client = MonitorClient(service.address)
    rows = client.wait_trace("t1", [0], timeout=5).to_pylist()
    assert sorted((r["filename"], r["bytes"]) for r in rows) == [("rank0.json", 19), ("store/seg.parquet", 400)]
    stub.UploadTrace(_chunks(files))                  # the agent resends after a lost reply
    assert len(client.traces(trace_id="t1").to_pylist()) == 2
    for r in rows:
        with open(r["path"], "rb") as f:
            assert f.read() == files[r["filename"]]


def test_a_trace_upload_cut_inside_a_file_is_refused_and_records_nothing(service, stub):
    files = {"rank0.json": b'{"traceEvents": []}', "second.json": b"[]" * 50}
    with pytest.raises(grpc.RpcError) as e:
        stub.UploadTrace(_chunks(files, cut="second.json"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "second.json" in e.value.details()
    assert MonitorClient(service.address).traces(trace_id="t1").num_rows == 0
    finished = service.store.trace_file_path("j", "t1", 0, "rank0.json")
    assert not finished.exists()          # the file that did arrive whole is not left behind


def test_a_failed_reupload_leaves_the_acknowledged_trace_intact(service, stub):
    files = {"rank0.json": b'{"traceEvents": []}', "second.json": b"[]" * 50}
    stub.UploadTrace(_chunks(files))                  # acknowledged
    client = MonitorClient(service.address)
    before = sorted((r["filename"], r["path"], r["bytes"]) for r in client.wait_trace("t1", [0], timeout=5).to_pylist())
    changed = {"rank0.json": b'{"traceEvents": [1]}', "second.json": b"{}" * 80}
    for cut in ("rank0.json", "second.json"):         # the resend aborts inside the first, then the second file
        with pytest.raises(grpc.RpcError) as e:
            stub.UploadTrace(_chunks(changed, cut=cut))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert sorted((r["filename"], r["path"], r["bytes"]) for r in client.traces(trace_id="t1").to_pylist()) == before
        for name, path, _ in before:
            with open(path, "rb") as f:
                assert f.read() == files[name]
    folder = service.store.trace_file_path("j", "t1", 0, "rank0.json").parent
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json", "second.json"]   # no part left behind
