"""``probe query``: SQL over a run's store as a user runs it, trusted or in the sandbox."""

from __future__ import annotations

import subprocess
import sys

from probe.collectors.store import StoreWriter, find_segments
from tests.conftest import run_probe


def _run(tmp_path, steps=3):
    with StoreWriter(tmp_path, rank=0, run="r") as w:
        for step in range(steps):
            w.write_rows("metric", [{"job": "r", "rank": 0, "step": step, "name": "loss", "value": 1.0}])
            w.end_step(step)
    return tmp_path


def test_a_corrupt_segment_is_skipped_with_a_warning_and_the_query_answers(tmp_path):
    run = _run(tmp_path)
    bad = find_segments(run)["metric"][1]
    with open(bad, "r+b") as f:
        f.truncate(40)
    r = run_probe("query", str(run), "select count(*) from steps", "--csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1] == "2"
    assert bad in r.stderr and "warning" in r.stderr and r.stderr.count("\n") == 1


def test_safe_refuses_reading_other_files_in_one_line(tmp_path):
    r = run_probe("query", "--safe", str(_run(tmp_path)), "select content from read_text('/etc/hostname')")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "SQL refused" in r.stderr


def test_safe_refuses_writing_a_file(tmp_path):
    target = tmp_path / "out.csv"
    r = run_probe("query", "--safe", str(_run(tmp_path)), f"copy (select 1) to '{target}'")
    assert r.returncode == 2 and "not COPY" in r.stderr and not target.exists()


def test_safe_answers_a_select_and_cuts_at_max_rows(tmp_path):
    r = run_probe("query", "--safe", "--max-rows", "2", str(_run(tmp_path)), "select step from steps order by step")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["step", "----", "0", "1", "(2", "rows;", "the", "rest", "cut", "at", "--max-rows)"]


def test_safe_interrupts_a_query_past_its_timeout(tmp_path):
    r = run_probe("query", "--safe", "--timeout", "0.5", str(_run(tmp_path)),
                  "select count(*) from range(100000000) a, range(100000) b", timeout=60)
    assert r.returncode == 2 and "ran past the sandbox's limit of 0.5 s" in r.stderr


def test_query_never_imports_torch(tmp_path):
    code = ("import sys; from probe.cli import main; rc = main(['query', '--safe', sys.argv[1], 'select 1']); "
            "assert 'torch' not in sys.modules, 'torch imported'; raise SystemExit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(_run(tmp_path))], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
