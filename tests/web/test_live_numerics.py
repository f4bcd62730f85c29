"""The live page's per-module numerics chart, against a real monitor service fed by real agents.

The callback's answers are checked directly (module choices, a line per rank, the anomaly
marked, only new steps sent on later ticks, a redraw on a new quantity, the link to the graph
view of the targeted dump an anomaly triggered); one browser test then follows that link from
the page to the graph view of the dump.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from dash import no_update

from probe.monitor.agent.monitor_agent import MonitorAgent
from probe.monitor.client import MonitorClient
from probe.monitor.numerics_names import QUANTITIES, metric_name
from probe.monitor.service.server import MonitorService
from tests.web.conftest import wait_for
from probe.visualizer.catalog import Catalog
from probe.web.pages import live_numerics
from probe.web.pages.live_source import LiveSource

MODULES = ("layers.0.mlp", "layers.1.mlp")
SPIKE = 12                                   # rank 1's layers.1.mlp grad_norm jumps here


def grad(rank: int, module: str, step: int) -> float:
    return (50.0 if (rank, module) == (1, "layers.1.mlp") and step >= SPIKE else
            1.0 + 0.01 * step + 0.1 * rank)


def send(agents, steps) -> None:
    for step in steps:
        for agent in agents:
            metrics = {"loss": 2.0, "step_time_ms": 40.0}
            for module in MODULES:
                for q in QUANTITIES:
                    metrics[metric_name(module, q)] = (
                        grad(agent.rank, module, step) if q == "grad_norm" else
                        0.0 if q == "nonfinite" else 0.5)
            agent.record(step, metrics)


def a_dump(folder: Path) -> None:
    """A real msprobe dump of a small network at ``folder`` (step 0, rank 1)."""
    import torch

    import probe

    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with probe.dump(net, out=str(folder), level="module", quiet=True, auto_step=False, store=False,
                    rank=1):
        net(torch.ones(3, 4)).sum().backward()


@pytest.fixture
def live(tmp_path):
    """A service holding 20 steps of 2 ranks' numerics, a numerics alert on rank 1's
    layers.1.mlp at step SPIKE and the targeted dump it triggered (done)."""
    # the detectors stay off (no round in the test's time): the one anomaly is the test's
    svc = MonitorService(tmp_path / "monitor.duckdb", port=0, detect_interval_s=3600)
    svc.start()
    agents = [MonitorAgent(svc.address, job="num", rank=r, world_size=2, sample_host=False,
                           spool_path=str(tmp_path / f"r{r}.spool"), flush_interval_s=0.02)
              for r in (0, 1)]
    for agent in agents:
        agent.start()
    send(agents, range(20))
    client = MonitorClient(svc.address)
    wait_for(lambda: client.metrics("num", since_step=19).num_rows == 2 * (2 + 12), timeout=30,
             what="20 steps stored")
    alert = svc.store.add_alert({"kind": "numerics_outlier", "job": "num", "rank": 1, "step": SPIKE,
                                 "message": f"rank 1 layers.1.mlp grad_norm = 50 at step {SPIKE}",
                                 "evidence": {"module": "layers.1.mlp", "quantity": "grad_norm"}})
    dump_dir = tmp_path / "num" / "monitor_dumps" / "d1"
    a_dump(dump_dir)
    svc.store.add_dump_request("d1", "num", [1], -1, -1, 2, "^Module\\.layers\\.1\\.mlp\\.",
                               "statistics", "module", "alert", alert["id"], "layers.1.mlp")
    svc.store.add_dump_report("d1", "num", 1, 0, 0, str(dump_dir), [0], 3, 100, "")
    yield {"svc": svc, "agents": agents, "alert": alert, "dump": dump_dir, "client": client}
    for agent in agents:
        agent.close()
    svc.stop(grace=0)


def test_the_callback_draws_a_module_per_rank_marks_anomalies_and_sends_only_new_steps(live, tmp_path):
    # the run folder given (--store): the dump the monitor reports under it may be opened
    source = LiveSource(monitor_addr=live["svc"].address, job="num", store_dirs=(str(tmp_path / "num"),))
    catalog = Catalog([])
    # at first, the module of the latest anomaly
    options, module, fig, ext, items, cursor = live_numerics.refresh(source, None, "grad_norm", {},
                                                                     catalog)
    assert [o["value"] for o in options] == list(MODULES) and module == "layers.1.mlp"
    options, module, fig, ext, items, cursor = live_numerics.refresh(source, "layers.0.mlp",
                                                                     "grad_norm", cursor, catalog)
    assert ext is no_update and [t.name for t in fig.data] == ["rank 0", "rank 1", "anomaly"]
    assert list(fig.data[0].x) == list(range(20)), list(fig.data[0].x)
    assert not fig.data[2].x, fig.data[2].x      # no anomaly on this module
    # the module with the anomaly: marked at its step, on rank 1's value
    options, module, fig, ext, items, cursor = live_numerics.refresh(source, "layers.1.mlp",
                                                                     "grad_norm", cursor, catalog)
    assert list(fig.data[2].x) == [SPIKE] and list(fig.data[2].y) == [50.0]
    assert list(fig.data[1].y)[SPIKE] == 50.0
    text = json.dumps(items, default=lambda o: o.to_plotly_json())
    link = live_numerics.graph_link({"path": str(live["dump"]), "steps": "[0]", "rank": 1})
    assert "numerics_outlier" in text and link in text
    # the graph page may open the dump now
    assert catalog.check(str(live["dump"]))
    # a tick with nothing new sends nothing; new steps are sent alone
    _, _, fig, ext, _, cursor = live_numerics.refresh(source, "layers.1.mlp", "grad_norm", cursor)
    assert fig is no_update and ext is no_update
    send(live["agents"], range(20, 23))
    wait_for(lambda: live["client"].metrics("num", since_step=22).num_rows == 2 * 14,
             what="3 more steps stored")
    _, _, fig, ext, _, cursor = live_numerics.refresh(source, "layers.1.mlp", "grad_norm", cursor)
    assert fig is no_update
    data, traces, _ = ext
    assert traces == [0, 1] and data["x"] == [[20, 21, 22], [20, 21, 22]]
    assert data["y"][1] == [50.0, 50.0, 50.0]
    # another quantity: drawn whole
    _, _, fig, ext, _, _ = live_numerics.refresh(source, "layers.1.mlp", "update_ratio", cursor)
    assert ext is no_update and list(fig.data[0].x) == list(range(23))


def test_module_list_and_points_from_a_run_store_without_a_monitor(tmp_path):
    from probe.collectors.store import StoreWriter

    writer = StoreWriter(str(tmp_path), rank=0, run="store-run", fsync="never")
    for step in range(3):
        writer.write_rows("metric", [{"time_ns": time.time_ns(), "job": "store-run", "rank": 0,
                                      "step": step, "name": n, "value": v} for n, v in
                                     (("loss", 1.0), (metric_name("layers.0", "grad_norm"), float(step)))])
        writer.end_step(step)
    writer.close()
    source = LiveSource(store_dirs=(str(tmp_path),))
    assert source.numerics_modules() == ["layers.0"]
    assert [p["value"] for p in source.numerics("layers.0", "grad_norm")] == [0.0, 1.0, 2.0]
    assert source.dumps() == []


@pytest.mark.browser
def test_an_anomaly_links_to_the_graph_of_its_targeted_dump(live, browser, serve_app, shot, tmp_path):
    pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[dev])")
    from selenium.webdriver.common.by import By

    from probe.web.app import create_app

    # the run's folder given, as `probe web --monitor ADDR --store runs/num` does: a dump the
    # monitor reports opens only under a folder the dashboard was given
    app = create_app(monitor_addr=live["svc"].address, job="num", refresh_ms=400,
                     store_dirs=(str(tmp_path / "num"),))
    browser.get(serve_app(app, "/live"))
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#l-numerics .js-plotly-plot"),
             timeout=60, what="the numerics chart")
    # the module of the latest anomaly is shown first
    marks = wait_for(lambda: browser.execute_script(
        "var g = document.querySelector('#l-numerics .js-plotly-plot');"
        "var t = g && g.data && g.data.filter(function (d) { return d.name === 'anomaly'; })[0];"
        "return t && t.x.length ? t.x : null;"), timeout=30, what="the anomaly mark")
    assert marks == [SPIKE]
    href = wait_for(lambda: browser.execute_script(
        "var a = document.querySelector('#l-num-anoms a.dump-link'); return a ? a.href : null;"),
        timeout=30, what="the link to the dump")
    assert "step=0" in href and "rank=1" in href and "monitor_dumps" in href
    browser.execute_script("document.getElementById('l-num-section').scrollIntoView();")
    shot("live_numerics")
    # the list is redrawn every refresh: click the link there now, in one go
    browser.execute_script("document.querySelector('#l-num-anoms a.dump-link').click();")
    title = wait_for(lambda: browser.find_element(By.ID, "g-title-a").text, timeout=60,
                     what="the graph view of the dump")
    assert "d1" in title, title
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#g-pane-a svg, #g-pane-a canvas"),
             timeout=60, what="the dump's graph drawn")
    shot("live_numerics_dump_graph")
