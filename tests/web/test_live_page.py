"""The live-cluster page in a real browser, on a record store written as a job runs and on a real
monitor service fed by real per-rank agents (and by a real two-rank training): the slow rank is
on top of the summary table at once and named in the banner when the monitor's detectors open a
straggler alert; alerts are counted per kind and rank; each refresh sends only new steps."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[dev])")

from selenium.webdriver.common.by import By  # noqa: E402

from probe.collectors.store import StoreWriter  # noqa: E402
from tests.web.conftest import wait_for  # noqa: E402
from tests.web.test_pages import metrics_at, points  # noqa: E402
from probe.web.app import create_app  # noqa: E402

pytestmark = pytest.mark.browser

#: The size of each live refresh the page has received (its response bodies), oldest first.
TICKS_JS = """return performance.getEntriesByType('resource')
    .filter(function (e) { return e.name.indexOf('_dash-update-component') >= 0; })
    .map(function (e) { return e.encodedBodySize; });"""


def text_of(browser, selector):
    """The text of an element the page redraws every refresh (read in one go, never stale)."""
    return browser.execute_script("var e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
                                  selector)


def top_row(browser):
    return text_of(browser, "#l-ranks-table tbody tr")


def last_step(browser):
    text = text_of(browser, "#l-status")
    return int(text.split("last step: ")[1].split(" ")[0]) if "last step: " in text and "—" not in text else -1


def annotation(browser, graph_id):
    return browser.execute_script(
        "var g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "return g && g.layout.annotations && g.layout.annotations.length ? g.layout.annotations[0].text : '';",
        graph_id)


def test_live_page_draws_a_store_as_the_job_writes_it_and_sends_only_new_steps(browser, serve_app, shot, tmp_path):
    (tmp_path / "store").mkdir()
    app = create_app(store_dirs=[str(tmp_path)], refresh_ms=300)
    browser.get(serve_app(app, "/live"))
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#l-step-time .js-plotly-plot"), timeout=60,
             what="the live page")
    assert "no step_time_ms reported" in annotation(browser, "l-step-time")
    writers = [StoreWriter(tmp_path, rank=r, run="t") for r in (0, 1)]
    sizes = {}
    for step in range(14):                   # the job runs: each step shows up without a reload
        before = len(browser.execute_script(TICKS_JS))
        for r, w in enumerate(writers):
            w.write_rows("metric", metrics_at(step, r, slow_rank=1))
            w.end_step(step)
        wait_for(lambda: points(browser, "l-step-time") == 2 * (step + 1), timeout=60,
                 what=f"step {step} on the chart")
        if step in (4, 13):                  # the refresh that brought the step
            sizes[step] = max(browser.execute_script(TICKS_JS)[before:])
    for w in writers:
        w.close()
    wait_for(lambda: points(browser, "l-heat") == 14, what="14 steps in the heat map")
    assert points(browser, "l-mfu") == 28 and top_row(browser).startswith("rank 1")
    assert "× peers" in text_of(browser, "#l-ranks-table")
    # the refresh bringing step 13 is no bigger than the one bringing step 4: only what is new travels
    assert sizes[13] <= 1.1 * sizes[4] + 100, sizes
    shot("live_store")


def test_live_page_puts_the_slow_rank_on_top_and_names_it_in_the_banner(browser, serve_app, shot, tmp_path):
    monitor_service = pytest.importorskip("probe.monitor.service.server")
    agent_mod = pytest.importorskip("probe.monitor.agent.monitor_agent")
    svc = monitor_service.MonitorService(store_path=tmp_path / "monitor.duckdb", port=0, detect_interval_s=0.1)
    addr = f"127.0.0.1:{svc.start()}"
    agents = [agent_mod.MonitorAgent(addr, job="demo", rank=r, world_size=2) for r in (0, 1)]
    try:
        for a in agents:
            a.start()
        browser.get(serve_app(create_app(monitor_addr=addr, refresh_ms=300), "/live"))
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#l-step-time .js-plotly-plot"), timeout=60,
                 what="the live page")
        on_top = named = None
        for step in range(30):               # rank 1 computes 3x slower than rank 0
            for r, a in enumerate(agents):
                slow = 3.0 if r == 1 else 1.0
                a.record(step, {"loss": 3.0, "step_time_ms": 40.0 * slow, "compute_time_ms": 30.0 * slow,
                                "comm_time_ms": 5.0, "data_time_ms": 1.0, "tokens_per_s": 9000 / slow})
            wait_for(lambda: last_step(browser) >= step, timeout=30, what=f"step {step} on the page")
            if on_top is None and top_row(browser).startswith("rank 1"):
                on_top = step
            if named is None and "rank 1" in text_of(browser, "#l-banner"):
                named = step
            if named is not None and step >= named + 2:
                break
        assert on_top is not None and on_top <= 2, on_top      # on top from the first steps
        assert named is not None, "the banner never named rank 1"
        banner = text_of(browser, "#l-banner")
        assert "straggler: rank 1" in banner
        raised = int(banner.split("since step ")[1].split()[0])
        assert named <= raised + 2, (named, raised)            # named as soon as the monitor says so
        assert named <= 10, named                               # within 10 steps of the run
        assert "straggler" in top_row(browser) and top_row(browser).startswith("rank 1")
        groups = browser.execute_script(
            "return Array.from(document.querySelectorAll('#l-alerts .alert')).map(e => e.innerText);")
        assert len([g for g in groups if g.startswith("straggler") and "rank 1" in g]) == 1, groups
        assert "no MFU" in annotation(browser, "l-mfu") and "--peak-tflops" in annotation(browser, "l-mfu")
        browser.find_element(By.ID, "l-ranks").send_keys("1")
        browser.find_element(By.ID, "l-steps").send_keys("40-41")
        browser.find_element(By.ID, "l-trace").click()
        wait_for(lambda: "requested" in browser.find_element(By.ID, "l-trace-msg").text,
                 what="trace request accepted")
        shot("live_monitor")
    finally:
        for a in agents:
            a.close()
        svc.stop()


@pytest.mark.slow
def test_live_page_follows_a_real_two_rank_training_and_names_the_slowed_rank(browser, serve_app, shot, tmp_path):
    from probe.monitor.service.server import MonitorService

    svc = MonitorService(store_path=tmp_path / "monitor.duckdb", port=0, detect_interval_s=0.1)
    addr = f"127.0.0.1:{svc.start()}"
    train = None
    try:
        browser.get(serve_app(create_app(monitor_addr=addr, refresh_ms=500), "/live"))
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#l-step-time .js-plotly-plot"), timeout=60,
                 what="the live page")
        train = subprocess.Popen(
            [sys.executable, "-m", "probe.cli", "train", "--preset", "tiny", "--nproc", "2", "--max-steps", "40",
             "--fault", "slow:1:3", "--out", str(tmp_path / "run")],
            env=dict(os.environ, PROBE_MONITOR=addr), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        tops = []
        while train.poll() is None:          # the page follows the job while it trains
            if last_step(browser) >= 0:
                tops.append(top_row(browser))
            time.sleep(0.3)
        assert train.returncode == 0, train.stderr.read()
        assert tops and all(t.startswith("rank 1") for t in tops), tops   # on top in every table drawn
        wait_for(lambda: points(browser, "l-step-time") == 80, timeout=30, what="40 steps × 2 ranks")
        # named once the monitor's detectors open the alert (when depends on how noisy the run is)
        wait_for(lambda: "straggler: rank 1" in text_of(browser, "#l-banner"), timeout=30,
                 what="the banner naming rank 1")
        assert top_row(browser).startswith("rank 1") and "straggler" in top_row(browser)
        shot("live_bundled_engine")
    finally:
        if train is not None and train.poll() is None:
            train.kill()
            train.wait(timeout=30)
        svc.stop()
