"""MonitorAgentCallback in a training loop: alerts can trigger a deep trace; the CLI asks for one.

The loop here is a plain per-rank loop driving the callback the way the bundled engine does
(ranks as threads, so it runs in a second); the engine itself is covered by test_engine.py.
"""

import json
import threading
import time
from pathlib import Path

import pytest

from probe.engine_adapter.callbacks import TrainContext
from probe.monitor.agent.callback import MonitorAgentCallback
from probe.monitor.client import MonitorClient
from probe.monitor.service.server import MonitorService
from probe.profiler import mstx
from tests.conftest import run_probe

from .conftest import wait_for


pytestmark = pytest.mark.slow

def run_ranks(addr, tmp, job, steps=60, world=4, slow_rank=None, step_s=0.03, callbacks=None,
              until=None):
    """Start ``world`` rank loops (threads) calling the callback; returns the threads.

    With ``until`` (an Event) the loops run up to ``steps`` steps but end as soon as it is set.
    """
    def rank_loop(rank):
        cb = MonitorAgentCallback(addr=addr, job=job, spool_path=str(tmp / f"{job}-r{rank}.spool"),
                                  flush_interval_s=0.02)
        if callbacks is not None:
            callbacks.append(cb)
        ctx = TrainContext(rank=rank, world_size=world, run=job, out_dir=str(tmp / f"rank{rank}"),
                           engine="reference", preset="tiny", device=None, model=None,
                           optimizer=None, config=None, max_steps=steps, store=None)
        cb.on_train_start(ctx)
        for step in range(steps):
            if until is not None and until.is_set():
                break
            cb.on_step_start(ctx, step)
            t0 = time.perf_counter()
            with mstx.range(f"step {step}", domain="step"):
                compute = step_s * (3 if rank == slow_rank else 1)
                time.sleep(compute)
            cb.on_step_end(ctx, step, {"loss": 2.0, "step_time_ms": (time.perf_counter() - t0) * 1e3,
                                       "compute_time_ms": compute * 1e3, "comm_time_ms": 1.0,
                                       "data_time_ms": 0.5})
        cb.on_train_end(ctx, None)

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    return threads


def trace_steps(path):
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return {e["args"]["step"] for e in events if "step" in e.get("args", {})}


def test_a_straggler_alert_triggers_a_deep_trace_of_that_rank(tmp_path):
    svc = MonitorService(tmp_path / "m.duckdb", port=0, detect_interval_s=0.05,
                         trace_on_alert={"straggler": 2})
    svc.start()
    try:
        threads = run_ranks(svc.address, tmp_path, "auto", slow_rank=1)
        client = MonitorClient(svc.address)
        wait_for(lambda: client.traces("auto").num_rows, timeout=60, what="the automatic trace")
        for t in threads:
            t.join(60)
        rows = client.traces("auto").to_pylist()
        assert {r["rank"] for r in rows} == {1} and not any(r["error"] for r in rows)
        first, last = rows[0]["start_step"], rows[0]["end_step"]
        assert last - first == 1
        alert = client.alerts("auto", kind="straggler").to_pylist()[0]
        assert alert["rank"] == 1 and alert["step"] < first
        trace = next(r["path"] for r in rows if r["filename"].endswith("rank1.json"))
        assert trace_steps(trace) == {first, last}
        requests = svc.store.trace_requests("auto").to_pylist()
        assert requests[0]["reason"].startswith(f"alert {alert['id']}")
    finally:
        svc.stop(grace=0)


def test_probe_monitor_trace_waits_for_the_ranks_and_copies_their_files(tmp_path, serve):
    server = serve()
    done = threading.Event()
    threads = run_ranks(server.addr, tmp_path, "cli", steps=5000, until=done)
    client = MonitorClient(server.addr)
    wait_for(lambda: len(client.status("cli")["jobs"]) and
             all(r["connected"] for r in client.status("cli")["jobs"][0]["ranks"]) and
             len(client.status("cli")["jobs"][0]["ranks"]) == 4, what="4 ranks")
    # one rank: the ranks here are threads of one process, and a process has one profiler
    res = run_probe("monitor", "trace", "--addr", server.addr, "--job", "cli", "--ranks", "2",
                    "--next", "3", "--wait", "--timeout", "60", "--out", str(tmp_path / "got"))
    done.set()
    for t in threads:
        t.join(60)
    assert res.returncode == 0, res.stderr
    assert "on ranks 2" in res.stdout and "copied rank 2" in res.stdout
    steps = trace_steps(tmp_path / "got" / "rank2" / "trace" / "rank2.json")
    assert len(steps) == 3 and max(steps) - min(steps) == 2
    listing = run_probe("monitor", "trace-files", "--addr", server.addr, "--job", "cli")
    assert listing.returncode == 0 and "rank 2 steps" in listing.stdout


def test_a_trace_for_steps_already_past_comes_back_as_an_error(tmp_path, service):
    threads = run_ranks(service.address, tmp_path, "late", steps=40, world=1)
    client = MonitorClient(service.address)
    wait_for(lambda: client.status("late")["jobs"] and
             client.status("late")["jobs"][0]["ranks"][0]["last_step"] >= 5, what="step 5")
    reply = client.request_trace("late", [0], steps="0-1")
    rows = client.wait_trace(reply["trace_id"], [0], timeout=30).to_pylist()
    for t in threads:
        t.join(60)
    assert rows[0]["error"] and "already started" in rows[0]["error"]


@pytest.mark.parametrize("bad", ["x", "5-2", "-3"])
def test_probe_monitor_trace_rejects_bad_step_ranges(bad, service):
    res = run_probe("monitor", "trace", "--addr", service.address, "--job", "j", "--steps", bad)
    assert res.returncode == 2 and "--steps" in res.stderr


def test_a_running_trace_can_be_stopped_and_the_send_interval_changed(tmp_path, serve):
    server = serve()
    callbacks, done = [], threading.Event()
    threads = run_ranks(server.addr, tmp_path, "stop", steps=5000, world=1, callbacks=callbacks,
                        until=done)
    client = MonitorClient(server.addr)
    wait_for(lambda: client.status("stop")["jobs"] and
             client.status("stop")["jobs"][0]["ranks"][0]["connected"], what="the rank")
    reply = client.request_trace("stop", [0], next_steps=4000)
    wait_for(lambda: callbacks[0]._active is not None, what="the trace to start")
    res = run_probe("monitor", "trace", "--addr", server.addr, "--job", "stop", "--stop")
    assert res.returncode == 0 and "stop sent to ranks 0" in res.stdout
    rows = client.wait_trace(reply["trace_id"], [0], timeout=60).to_pylist()
    res = run_probe("monitor", "interval", "--addr", server.addr, "--job", "stop", "0.5")
    assert res.returncode == 0, res.stderr
    wait_for(lambda: callbacks[0].agent.flush_interval_s == 0.5, what="the new interval")
    done.set()
    for t in threads:
        t.join(60)
    first, last = rows[0]["start_step"], rows[0]["end_step"]
    assert not rows[0]["error"] and last - first < 3999
    traces = [r["path"] for r in rows if r["filename"].endswith("rank0.json")]
    assert traces, [(r["filename"], r["bytes"], r["error"]) for r in rows]
    trace = traces[0]
    assert trace_steps(trace) == set(range(first, last + 1))
