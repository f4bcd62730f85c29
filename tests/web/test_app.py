"""The dashboard without a browser: construction, bad input, and the data behind the pages."""

from __future__ import annotations

import pytest

from probe.collectors.sql_sandbox import run_untrusted
from probe.collectors.store import StoreWriter
from probe.ground.errors import ProbeError
from tests.conftest import run_probe
from probe.visualizer.navigate import first_divergence
from probe.web.app import create_app
from probe.visualizer.cluster import series
from probe.web.pages.live_source import LiveSource
from probe.web.pages.query import LIMITS, quick_chart


def _store(tmp_path, steps=3):
    w = StoreWriter(tmp_path, rank=0, run="j")
    for step in range(steps):
        w.write_rows("metric", [{"time_ns": step, "job": "j", "rank": 0, "step": step, "name": n, "value": v}
                                for n, v in (("step_time_ms", 50.0), ("comm_time_ms", 10.0), ("loss", 2.0))])
        w.end_step(step)
    w.close()
    return tmp_path


def test_app_builds_every_page_with_and_without_data(tmp_path, msprobe_data):
    app = create_app(dump_a=msprobe_data / "torch_llama_mix", store_dirs=[str(_store(tmp_path))])
    assert app.probe_diff is not None and not app.probe_diff.paired
    assert create_app().probe_diff is None


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(ProbeError, match="no such dump"):
        create_app(dump_a=tmp_path / "nope")
    with pytest.raises(ProbeError, match="no such run directory"):
        create_app(store_dirs=[str(tmp_path / "nope")])
    with pytest.raises(ProbeError, match="no such trace file"):
        create_app(trace_file=tmp_path / "trace.json")


def test_query_runs_sql_over_the_store_and_reports_sql_errors(tmp_path):
    result = run_untrusted(str(_store(tmp_path)), "select step, step_time_ms from steps order by step", LIMITS)
    cols, rows = result.columns, result.rows
    assert cols == ["step", "step_time_ms"] and rows == [(0, 50.0), (1, 50.0), (2, 50.0)]
    assert len(quick_chart(cols, rows).data) == 1
    with pytest.raises(ProbeError, match="SQL error"):
        run_untrusted(str(tmp_path), "select nope from steps", LIMITS)


def test_live_source_reads_the_store_and_derives_the_communication_share(tmp_path):
    data = series(LiveSource(store_dirs=(str(_store(tmp_path)),)).metrics())
    assert data["step_time_ms"][0] == {0: 50.0, 1: 50.0, 2: 50.0}
    assert data["comm_share"][0][2] == pytest.approx(0.2)


def test_trace_requests_without_a_monitor_say_how_to_start_one():
    with pytest.raises(ProbeError, match="--monitor"):
        LiveSource(store_dirs=("x",)).request_trace([0], 1, 2)


def test_probe_web_rejects_a_missing_dump_in_one_line(tmp_path):
    r = run_probe("web", "--dump", str(tmp_path / "missing"), "--port", "0", timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such dump" in r.stderr


def test_a_compare_result_alone_opens_the_dumps_it_names(tmp_path, msprobe_data):
    from probe.compare.api import compare

    compare(str(msprobe_data / "torch_L0"), str(msprobe_data / "mindspore_L0")).write(tmp_path / "cmp")
    diff = create_app(compare_dir=tmp_path / "cmp").probe_diff
    assert diff.paired and diff.counterpart("a", "Module.embed.Linear.forward.0") == "Cell.embed.Dense.forward.0"
    assert diff.counts()["error"] == 0 and first_divergence(diff) is None


def test_live_page_with_an_unreachable_monitor_reports_it_instead_of_failing():
    from probe.monitor.service.server import free_port

    source = LiveSource(monitor_addr=f"127.0.0.1:{free_port()}")
    with pytest.raises(ProbeError):
        source.metrics()


def test_probe_web_serves_the_dashboard_on_loopback(msprobe_data):
    import re
    import subprocess
    import sys
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "probe.cli", "web", "--dump", str(msprobe_data / "torch_L0"),
                             str(msprobe_data / "mindspore_L0"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving on (http://127\.0\.0\.1:\d+)/", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        with urllib.request.urlopen(m.group(1) + "/_dash-dependencies", timeout=30) as r:
            deps = r.read()
        assert b"g-update" in deps and b"g-pane-b" in deps      # the graph-diff page
    finally:
        proc.terminate()
        proc.wait(timeout=30)
