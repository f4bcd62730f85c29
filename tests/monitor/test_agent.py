"""The agent never blocks training, spools while the service is away and resends exactly once."""

import time

from probe.monitor.agent.monitor_agent import MonitorAgent
from probe.monitor.agent.spool import Spool
from probe.monitor.client import MonitorClient
from probe.monitor.service.server import free_port

from .conftest import wait_for


def points_per_rank_step(addr, job):
    rows = MonitorClient(addr).metrics(job).to_pylist()
    counts = {}
    for r in rows:
        key = (r["rank"], r["step"], r["name"])
        counts[key] = counts.get(key, 0) + 1
    return rows, counts


def test_record_never_blocks_and_counts_what_a_full_queue_drops(tmp_path):
    agent = MonitorAgent(f"127.0.0.1:{free_port()}", "j", 0, queue_size=10,
                         spool_path=tmp_path / "s.spool")      # not started: nothing drains
    t0 = time.perf_counter()
    accepted = [agent.record(s, {"loss": 1.0, "step_time_ms": 2.0}) for s in range(1000)]
    elapsed = time.perf_counter() - t0
    assert accepted.count(True) == 10 and agent.dropped == 990 * 2
    assert elapsed < 0.5


def test_points_recorded_while_the_service_is_down_arrive_once_it_is_up(tmp_path, serve):
    port = free_port()
    agent = MonitorAgent(f"127.0.0.1:{port}", "j", 0, 1, spool_path=tmp_path / "r0.spool",
                         flush_interval_s=0.02, sample_host=False).start()
    for step in range(50):
        agent.record(step, {"loss": float(step), "step_time_ms": 10.0})
    wait_for(lambda: Spool(tmp_path / "r0.spool").exists(), what="the spool file")
    server = serve(port=port)
    for step in range(50, 80):
        agent.record(step, {"loss": float(step), "step_time_ms": 10.0})
    agent.close()
    assert not (tmp_path / "r0.spool").exists()
    rows, counts = points_per_rank_step(server.addr, "j")
    assert len(rows) == 160 and set(counts.values()) == {1}
    assert sorted({r["step"] for r in rows}) == list(range(80))
    assert agent.stats["acked_points"] == agent.stats["points"] == 160


def test_a_spool_left_by_a_dead_rank_is_sent_by_the_next_agent_exactly_once(tmp_path, serve):
    port = free_port()
    spool = tmp_path / "r3.spool"
    first = MonitorAgent(f"127.0.0.1:{port}", "j", 3, 4, spool_path=spool, sample_host=False,
                         exit_wait_s=0.5).start()
    for step in range(20):
        first.record(step, {"loss": 1.0})
    first.close(timeout=8)                       # no service: everything stays in the spool
    assert spool.exists() and len(list(Spool(spool).read())) >= 1
    server = serve(port=port)
    second = MonitorAgent(server.addr, "j", 3, 4, spool_path=spool, sample_host=False).start()
    for step in range(20, 25):
        second.record(step, {"loss": 2.0})
    second.close()
    rows, counts = points_per_rank_step(server.addr, "j")
    assert sorted(r["step"] for r in rows) == list(range(25)) and set(counts.values()) == {1}
    assert not spool.exists()


def test_host_metrics_and_final_flag_reach_the_service(tmp_path, service):
    agent = MonitorAgent(service.address, "j", 0, 1, spool_path=tmp_path / "s",
                         flush_interval_s=0.02).start()
    for step in range(3):
        agent.record(step, {"loss": 1.0})
        time.sleep(0.05)
    agent.close()
    names = set(MonitorClient(service.address).metrics("j").column("name").to_pylist())
    assert {"host_cpu_percent", "host_mem_percent", "proc_rss_mb", "loss"} <= names
    ranks = MonitorClient(service.address).status()["jobs"][0]["ranks"]
    assert ranks[0]["health"] == "finished"


def test_odd_metric_values_and_names_are_skipped_not_fatal(tmp_path, service):
    import numpy as np

    agent = MonitorAgent(service.address, "odd", 0, 1, spool_path=tmp_path / "o",
                         flush_interval_s=0.02, sample_host=False).start()
    agent.record(0, {"loss": np.float32(1.5), "flag": True, "note": "text", "n": 3,
                     "": 1.0, "x" * 300: 2.0, "none": None})
    agent.record(-1, {"loss": 1.0})
    agent.record(1, {"loss": 2.5})
    agent.close()
    rows = MonitorClient(service.address).metrics("odd").to_pylist()
    assert sorted((r["step"], r["name"], r["value"]) for r in rows) == [
        (0, "loss", 1.5), (0, "n", 3.0), (1, "loss", 2.5)]
    assert agent.stats["rejected_batches"] == 0


def test_an_agent_with_the_token_streams_and_one_without_is_refused(tmp_path, caplog):
    from probe.monitor.service.server import MonitorService

    svc = MonitorService(tmp_path / "m.duckdb", port=0, token="tok")
    svc.start()
    try:
        good = MonitorAgent(svc.address, "auth", 0, 2, token="tok", spool_path=tmp_path / "g",
                            sample_host=False).start()
        bad = MonitorAgent(svc.address, "auth", 1, 2, token="", spool_path=tmp_path / "b",
                           sample_host=False, exit_wait_s=0.5).start()
        for agent in (good, bad):
            agent.record(0, {"loss": 1.0})
            agent.close()
        ranks = {r["rank"] for r in MonitorClient(svc.address, token="tok").metrics("auth").to_pylist()}
        assert ranks == {0}
        assert bad.spool.exists()                      # kept for a run with the right token
        assert "refused the token" in caplog.text          # logged (probe.monitor.agent...), not printed
    finally:
        svc.stop(grace=0)


def test_a_full_spool_drops_and_counts_and_the_service_learns_the_count(tmp_path, serve):
    port = free_port()
    agent = MonitorAgent(f"127.0.0.1:{port}", "full", 0, 1, spool_path=tmp_path / "f.spool",
                         flush_interval_s=0.01, sample_host=False, max_spool_bytes=4096).start()
    for step in range(400):
        agent.record(step, {"loss": 1.0, "step_time_ms": 2.0})
        if step % 50 == 0:
            time.sleep(0.02)
    wait_for(lambda: agent.dropped > 0, what="drops")
    assert agent.spool.size <= 4096
    server = serve(port=port)
    agent.close()
    rows, counts = points_per_rank_step(server.addr, "full")
    assert set(counts.values()) == {1}
    assert len(rows) + agent.dropped == 800
    rank = MonitorClient(server.addr).status("full")["jobs"][0]["ranks"][0]
    assert rank["dropped"] == agent.dropped and rank["points"] == len(rows)
