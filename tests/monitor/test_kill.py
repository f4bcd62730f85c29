"""SIGKILL the service mid-run, restart it on the same store: every point present exactly once."""

import threading
import time

import pytest

from probe.monitor.agent.monitor_agent import MonitorAgent
from probe.monitor.client import MonitorClient
from probe.monitor.service.server import free_port

from .conftest import wait_for

pytestmark = pytest.mark.slow

STEPS = 600
METRICS = ("loss", "step_time_ms", "compute_time_ms", "comm_time_ms", "data_time_ms")


def test_sigkill_and_restart_on_the_same_store_keeps_every_point_exactly_once(tmp_path, serve):
    port, store = free_port(), tmp_path / "monitor.duckdb"
    first = serve(port=port, store=store)
    agents = [MonitorAgent(first.addr, "killjob", rank, 2, spool_path=tmp_path / f"r{rank}.spool",
                           flush_interval_s=0.01, sample_host=False).start() for rank in range(2)]
    progress = {"step": -1}
    resume = threading.Event()

    def train():
        for step in range(STEPS):
            for rank, agent in enumerate(agents):
                agent.record(step, {m: float(step * 10 + rank) for m in METRICS})
            progress["step"] = step
            if step == STEPS // 2:
                resume.wait(60)         # keep the second half for after the restart
            time.sleep(0.001)

    trainer = threading.Thread(target=train)
    trainer.start()
    wait_for(lambda: min(a.stats["acked_points"] for a in agents) > 200, what="acks")
    first.kill()                                         # SIGKILL, mid-stream
    acked_before_kill = [a.stats["acked_points"] for a in agents]
    wait_for(lambda: all(a.spool.exists() for a in agents) and progress["step"] >= STEPS // 2,
             what="both agents spooling")
    spooled = [a.stats["spooled_batches"] for a in agents]
    second = serve(port=port, store=store)               # same port, same store
    resume.set()
    trainer.join(60)
    for agent in agents:
        agent.close()
    assert all(s > 0 for s in spooled) and all(a > 0 for a in acked_before_kill)
    rows = MonitorClient(second.addr).metrics("killjob").to_pylist()
    seen = {}
    for r in rows:
        key = (r["rank"], r["step"], r["name"])
        seen[key] = seen.get(key, 0) + 1
        assert r["value"] == float(r["step"] * 10 + r["rank"])
    doubled = [k for k, n in seen.items() if n > 1]
    missing = [(rank, step, m) for rank in range(2) for step in range(STEPS) for m in METRICS
               if (rank, step, m) not in seen]
    assert doubled == [] and missing == []
    assert len(rows) == 2 * STEPS * len(METRICS) == sum(a.stats["points"] for a in agents)
    assert all(not a.spool.exists() for a in agents)


def test_a_frozen_service_never_slows_recording_and_loses_nothing(tmp_path, serve):
    import signal

    server = serve()
    agent = MonitorAgent(server.addr, "frozen", 0, 1, spool_path=tmp_path / "f.spool",
                         flush_interval_s=0.01, sample_host=False, push_timeout_s=0.5).start()
    for step in range(50):
        agent.record(step, {"loss": float(step)})
    wait_for(lambda: agent.stats["acked_points"] == 50, what="first acks")
    server.proc.send_signal(signal.SIGSTOP)              # a consumer that stops reading
    try:
        worst = 0.0
        for step in range(50, 2050):
            t0 = time.perf_counter()
            agent.record(step, {"loss": float(step)})
            worst = max(worst, time.perf_counter() - t0)
            if step % 100 == 0:
                time.sleep(0.05)
        wait_for(lambda: agent.spool.exists(), timeout=20, what="spooling while frozen")
    finally:
        server.proc.send_signal(signal.SIGCONT)
    agent.close(timeout=60)
    assert worst < 0.05
    steps = MonitorClient(server.addr).metrics("frozen").column("step").to_pylist()
    assert sorted(steps) == list(range(2050))
