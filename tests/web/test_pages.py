"""Query and timeline pages in a real browser, on real stores and traces (the live page:
test_live_page.py)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e .[dev])")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from probe.collectors.store import StoreWriter
from tests.web.conftest import wait_for
from probe.web.app import create_app

pytestmark = pytest.mark.browser


def metrics_at(step, rank, slow_rank=None, job="t"):
    slow = 3.0 if rank == slow_rank else 1.0
    return [{"time_ns": time.time_ns(), "job": job, "rank": rank, "step": step, "name": n, "value": v}
            for n, v in (("loss", 5.0 - 0.1 * step), ("step_time_ms", 40.0 * slow + step),
                         ("tokens_per_s", 8000.0 / slow), ("comm_time_ms", 8.0),
                         ("compute_time_ms", 30.0 * slow), ("mfu", 0.2 / slow))]


def write_steps(run_dir, steps, ranks=2, job="t"):
    """Per-rank engine metrics, one segment per step, as the bundled engine writes them."""
    writers = [StoreWriter(run_dir, rank=r, run=job) for r in range(ranks)]
    for step in range(steps):
        for r, w in enumerate(writers):
            w.write_rows("metric", metrics_at(step, r, job=job))
            w.end_step(step)
    for w in writers:
        w.close()


def set_text(element, text):
    """Replace the text of a React-controlled input (``clear()`` bypasses React's state)."""
    element.send_keys(Keys.CONTROL, "a")
    element.send_keys(Keys.DELETE)
    element.send_keys(text)


def points(browser, graph_id):
    """Number of points drawn in a dcc.Graph (all traces)."""
    return browser.execute_script(
        "var g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "if (!g || !g.data) return -1;"
        "return g.data.reduce(function(n, t) { return n + (t.x ? t.x.length : 0); }, 0);", graph_id)


def test_query_page_runs_sql_and_draws_a_table_and_chart(browser, serve_app, shot, tmp_path):
    write_steps(tmp_path, steps=6)
    browser.get(serve_app(create_app(store_dirs=[str(tmp_path)]), "/query"))
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#q-table td"), timeout=60, what="default query")
    sql = browser.find_element(By.ID, "q-sql")
    set_text(sql, "select step, avg(step_time_ms) as ms from steps group by step order by step")
    browser.find_element(By.ID, "q-run").click()
    wait_for(lambda: browser.find_element(By.ID, "q-count").text == "6 row(s)", what="6 rows")
    wait_for(lambda: points(browser, "q-chart") == 6, what="chart of 6 points")
    set_text(sql, "select nope from steps")
    browser.find_element(By.ID, "q-run").click()
    wait_for(lambda: "SQL error" in browser.find_element(By.ID, "q-error").text, what="SQL error line")
    set_text(sql, "select content from read_text('/etc/hostname')")
    browser.find_element(By.ID, "q-run").click()
    wait_for(lambda: "SQL refused" in browser.find_element(By.ID, "q-error").text, what="file read refused")
    assert "Read-only sandbox" in browser.find_element(By.ID, "q-limits").text
    set_text(sql, "select rank, step, step_time_ms from steps order by rank, step")
    browser.find_element(By.ID, "q-run").click()
    wait_for(lambda: browser.find_element(By.ID, "q-count").text == "12 row(s)", what="12 rows")
    wait_for(lambda: browser.execute_script(
        "return document.querySelector('#q-chart .js-plotly-plot').data.map(t => t.name).join(',')")
        == "step_time_ms rank 0,step_time_ms rank 1", what="one series per rank over steps")
    shot("query")


def test_query_page_without_the_token_says_how_to_get_it(browser, serve_app, shot, tmp_path):
    write_steps(tmp_path, steps=2)
    signed = serve_app(create_app(store_dirs=[str(tmp_path)]), "/")
    browser.get(signed.split("?")[0])                       # the open graph page, not signed in
    wait_for(lambda: browser.find_elements(By.ID, "nav-query"), what="the navigation bar")
    browser.find_element(By.ID, "nav-query").click()
    wait_for(lambda: "needs the dashboard's token" in browser.find_element(By.ID, "page").text,
             what="the page saying it needs the token")
    assert not browser.find_elements(By.ID, "q-sql")
    shot("query_needs_token")


def test_timeline_page_draws_ranks_and_links_perfetto(browser, serve_app, shot, tmp_path):
    from probe.profiler import mstx
    from probe.profiler.session import Session

    for rank in (0, 1):
        with Session(tmp_path, rank=rank, trace=True, store=True) as s:
            for step in range(3):
                with mstx.range(f"step {step}", domain="step"):
                    with mstx.range("forward", domain="engine"):
                        time.sleep(0.002 * (rank + 1))
                    with mstx.range("backward", domain="engine"):
                        time.sleep(0.001)
                s.step()
    trace = tmp_path / "trace" / "rank0.json"
    assert trace.is_file()
    browser.get(serve_app(create_app(trace_file=trace), "/timeline"))
    wait_for(lambda: points(browser, "t-graph") >= 9, timeout=60, what="9 spans")
    link = browser.find_element(By.ID, "t-perfetto").get_attribute("href")
    assert link.startswith("https://ui.perfetto.dev/#!/?url=") and "files%2Ftrace.json" in link
    body = browser.execute_script("return fetch('/files/trace.json').then(r => r.text())")
    assert "traceEvents" in body
    shot("timeline_trace")
    # the same page from the record store: both ranks' events
    browser.get(serve_app(create_app(store_dirs=[str(tmp_path)]), "/timeline"))
    wait_for(lambda: points(browser, "t-graph") >= 18, timeout=30, what="18 spans from 2 ranks")
    lanes = browser.execute_script(
        "var g = document.querySelector('#t-graph .js-plotly-plot');"
        "return Array.from(new Set([].concat.apply([], g.data.map(function(t) { return t.y; }))));")
    assert any("rank 0" in l for l in lanes) and any("rank 1" in l for l in lanes)
    shot("timeline_store")
