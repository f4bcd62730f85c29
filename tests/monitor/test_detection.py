"""The service's detection: one alert per cause updated in place, the rolling window, and hang
diagnosis from the collectives the ranks report."""

import json

import grpc
import numpy as np
import pytest

from probe.monitor.client import MonitorClient
from probe.monitor.detectors.step_detectors import StepMatrix, detect
from probe.monitor.proto import monitor_pb2 as pb
from probe.monitor.proto import monitor_pb2_grpc as pb_grpc
from probe.monitor.service.detection import AlertBook, JobWindow
from probe.monitor.service.server import MonitorService
from tests.conftest import run_probe

from .conftest import wait_for
from .test_detectors import noisy_job

NAMES = ("step_time_ms", "compute_time_ms", "comm_time_ms", "data_time_ms", "loss")


@pytest.fixture
def stub(service):
    channel = grpc.insecure_channel(service.address)
    yield pb_grpc.MonitorStub(channel)
    channel.close()


def push_step(stub, job, rank, seq, step, compute, world=4):
    vals = np.float64([compute + 16.0, compute, 15.0, 1.0, 2.0])
    return stub.Push(pb.MetricBatch(
        job=job, rank=rank, agent_id=f"a{rank}", seq=seq, names=list(NAMES),
        name_index=np.arange(len(NAMES), dtype=np.int32).tobytes(),
        steps=np.full(len(NAMES), step, np.int64).tobytes(),
        time_ns=np.full(len(NAMES), 1, np.int64).tobytes(), values=vals.tobytes()))


def register(stub, job, world):
    for rank in range(world):
        stub.Register(pb.RegisterRequest(job=job, rank=rank, world_size=world, agent_id=f"a{rank}"))


def test_a_straggler_is_one_alert_updated_in_place_while_it_lasts(service, stub):
    register(stub, "j", 4)
    for step in range(30):
        for rank in range(4):
            push_step(stub, "j", rank, step + 1, step, 300.0 if rank == 3 else 100.0 + rank)
    wait_for(lambda: service.detection.judged_step("j") == 29, what="30 steps judged")
    rows = service.store.alerts("j").to_pylist()
    assert [(a["kind"], a["rank"]) for a in rows] == [("straggler", 3)]
    alert = rows[0]
    assert alert["state"] == "open" and alert["last_step"] == 29 and alert["count"] > 10
    assert alert["count"] == len(range(alert["step"], 30))     # once per step it was seen
    text = run_probe("monitor", "alerts", "--addr", service.address).stdout
    assert f"rank 3 step {alert['step']}-29 x{alert['count']}" in text


def test_after_a_restart_an_open_alert_goes_on_being_updated(tmp_path):
    store = tmp_path / "m.duckdb"
    svc = MonitorService(store, port=0, detect_interval_s=0.05)
    svc.start()
    try:
        stub = pb_grpc.MonitorStub(grpc.insecure_channel(svc.address))
        register(stub, "j", 4)
        for step in range(12):
            for rank in range(4):
                push_step(stub, "j", rank, step + 1, step, 300.0 if rank == 1 else 100.0)
        wait_for(lambda: svc.detection.judged_step("j") == 11, what="12 steps judged")
    finally:
        svc.stop(grace=0)
    again = MonitorService(store, port=0, detect_interval_s=600)
    again.start()
    try:
        stub = pb_grpc.MonitorStub(grpc.insecure_channel(again.address))
        for rank in range(4):                  # the ranks' agents, restarted too
            stub.Register(pb.RegisterRequest(job="j", rank=rank, world_size=4, agent_id=f"b{rank}"))
        for step in range(12, 20):
            for rank in range(4):
                compute = 300.0 if rank == 1 else 100.0
                stub.Push(pb.MetricBatch(
                    job="j", rank=rank, agent_id=f"b{rank}", seq=step, names=list(NAMES),
                    name_index=np.arange(5, dtype=np.int32).tobytes(),
                    steps=np.full(5, step, np.int64).tobytes(),
                    time_ns=np.full(5, 1, np.int64).tobytes(),
                    values=np.float64([compute + 16.0, compute, 15.0, 1.0, 2.0]).tobytes()))
        assert again.detect_once() == []                      # no new alert...
        [alert] = again.store.alerts("j").to_pylist()
        assert alert["last_step"] == 19                       # ...the open one goes on
    finally:
        again.stop(grace=0)


def heartbeat(stub, job, rank, step_in, pending, entered):
    msg = pb.MetricBatch(job=job, rank=rank, agent_id=f"a{rank}", seq=0,
                         reports_collectives=True, step_in=step_in)
    if pending:
        op, seq, waiting = pending
        msg.pending.op, msg.pending.seq, msg.pending.group = op, seq, "world"
        msg.pending.bytes, msg.pending.group_size, msg.pending.waiting_s = 4 << 20, 4, waiting
    msg.entered.update(entered)
    stub.Push(msg)


def test_a_hang_is_raised_naming_the_rank_that_never_entered_and_resolved_when_it_moves(service,
                                                                                        stub):
    register(stub, "h", 4)
    for step in range(6):
        for rank in range(4):
            push_step(stub, "h", rank, step + 1, step, 100.0)
    wait_for(lambda: service.detection.judged_step("h") == 5, what="6 steps judged")
    for rank in (0, 2, 3):                    # in all_reduce #7 for 6 s; rank 1 never came
        heartbeat(stub, "h", rank, 6, ("all_reduce", 7, 6.0), {"world": 7})
    heartbeat(stub, "h", 1, 6, None, {"world": 6})
    alert = wait_for(lambda: service.store.alerts("h", kind="hang").to_pylist(), what="a hang")[0]
    assert alert["rank"] == 1
    assert alert["message"].startswith("hang: rank 1 never entered all_reduce #7 (group world, "
                                       "4.0 MiB); ranks 0, 2, 3 have waited in it for")
    doc = MonitorClient(service.address).status("h")
    job = doc["jobs"][0]
    assert job["health"] == "hung" and job["hang"]["rank"] == 1
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert ranks[0]["collective"]["op"] == "all_reduce" and ranks[0]["collective"]["seq"] == 7
    assert ranks[0]["collective"]["waiting_s"] >= 6.0 and ranks[1]["collective"] is None
    text = run_probe("monitor", "status", "--addr", service.address).stdout
    assert "HANG #" in text and "rank 1 never entered all_reduce #7" in text
    assert "all_reduce #7" in text
    for rank in range(4):                     # it moved on: nobody waits any more
        heartbeat(stub, "h", rank, 7, None, {"world": 7})
    wait_for(lambda: MonitorClient(service.address).status("h")["jobs"][0]["hang"] is None,
             what="the hang resolved")
    [stored] = service.store.alerts("h", kind="hang").to_pylist()
    assert stored["state"] == "closed" and "[resolved" in stored["message"]


def _rank_0_waits_in_all_reduce(service, stub, job: str, waiting_s: float) -> None:
    """A 2-rank job with 4 steps judged, then rank 0 in all_reduce #5 for ``waiting_s`` while
    rank 1 has not entered it."""
    register(stub, job, 2)
    for step in range(4):
        for rank in range(2):
            push_step(stub, job, rank, step + 1, step, 100.0, world=2)
    wait_for(lambda: service.detection.judged_step(job) == 3, what="4 steps judged")
    heartbeat(stub, job, 0, 4, ("all_reduce", 5, waiting_s), {"world": 5})
    heartbeat(stub, job, 1, 4, None, {"world": 4})


def test_a_resolved_hang_is_stored_closed_before_the_status_says_so(service, stub):
    """The status reads the open alerts; the store must hold the hang closed by then."""
    _rank_0_waits_in_all_reduce(service, stub, "r", 6.0)
    wait_for(lambda: service.store.alerts("r", kind="hang").to_pylist(), what="a hang")
    seen = []
    update = service.store.update_alert

    def recorded(alert):
        if alert.get("kind") == "hang" and alert.get("state") == "closed":
            seen.append(service.detection.open_hang("r") is not None)
        update(alert)
    service.store.update_alert = recorded
    for rank in range(2):
        heartbeat(stub, "r", rank, 5, None, {"world": 5})
    wait_for(lambda: seen, what="the hang stored closed")
    assert seen == [True]              # the status still showed it open when it was stored


def test_a_waiting_collective_below_the_jobs_threshold_is_no_hang(service, stub):
    _rank_0_waits_in_all_reduce(service, stub, "w", 2.0)
    service.detect_once()
    assert service.store.alerts("w", kind="hang").num_rows == 0


def test_the_window_fed_step_by_step_finds_what_the_whole_table_does():
    m = noisy_job(n_ranks=16, n_steps=90, seed=11, slow_rank=5, factor=1.5, onset=50)
    whole = [(a["kind"], a["rank"], a["step"]) for a in detect(m, job="j")]
    window, seen = JobWindow("j"), []
    for i in range(len(m.steps)):
        window.append(StepMatrix(m.steps[i:i + 1], m.ranks,
                                 {k: v[i:i + 1] for k, v in m.cols.items()}, "j"))
        seen += [(a["kind"], a["rank"], a["step"]) for a in window.judge([int(m.steps[i])])]
    assert seen == whole and ("straggler", 5) in {(k, r) for k, r, _ in seen}


def test_the_window_takes_a_rank_that_appears_late():
    window = JobWindow("j", size=10)
    rows = [{"rank": r, "step": s, "step_time_ms": 10.0} for s in range(3) for r in range(2)]
    window.append(StepMatrix.of(rows))
    window.append(StepMatrix.of([{"rank": r, "step": 3, "step_time_ms": 10.0} for r in range(3)]))
    assert window.matrix.ranks.tolist() == [0, 1, 2]
    assert np.isnan(window.matrix.cols["step_time_ms"][0, 2])
    assert window.matrix.derived["own_bins"][:, 2].tolist() == [-1, -1, -1, 0]


def test_an_alert_closed_long_ago_is_opened_anew():
    book = AlertBook(close_after=5)
    a = {"kind": "slow_step", "job": "j", "rank": None, "step": 10, "message": "m", "evidence": {}}
    first, new = book.merge(a)
    assert new and book.expire("j", 14) == [] and book.expire("j", 16) == [first]
    assert first["state"] == "closed" and book.merge(dict(a, step=17))[1]
    assert json.dumps(book.open[("j", "slow_step", None)]["evidence"]) == "{}"
