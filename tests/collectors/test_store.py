"""The record store: streamed segments, DuckDB views, durability across kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from probe.collectors.records import SCHEMAS, table_from_rows
from probe.collectors.store import StoreWriter, find_segments, load_segments, open_store
from probe.ground.errors import ProbeError
from tests.conftest import run_probe


def test_every_record_kind_round_trips_through_duckdb(tmp_path):
    w = StoreWriter(tmp_path, rank=1, run="r")
    w.write_rows("tensor", [{"run": "r", "rank": 1, "step": 0, "seq": 0, "node": "Module.a.Linear.forward.0",
                             "node_kind": "module", "direction": "forward", "slot": "output", "index": "0",
                             "dtype": "torch.float32", "shape": [2, 3], "numel": 6, "max": 1.0}])
    w.write_rows("node", [{"run": "r", "rank": 1, "node": "Module.a.Linear.forward.0", "depth": 1}])
    w.write_rows("event", [{"run": "r", "rank": 1, "step": 0, "name": "step 0", "kind": "step",
                            "host_start_ns": 1, "host_end_ns": 5}])
    w.write_rows("metric", [{"time_ns": 1, "job": "r", "rank": 1, "step": 0, "name": "loss", "value": 1.5}])
    w.close()
    con = open_store(tmp_path)
    assert con.sql("select shape, max from tensors").fetchall() == [([2, 3], 1.0)]
    assert con.sql("select count(*) from nodes").fetchall()[0][0] == 1
    assert con.sql("select host_end_ns - host_start_ns from events").fetchall()[0][0] == 4
    assert con.sql("select rank, step, loss from steps").fetchall() == [(1, 0, 1.5)]


def test_empty_kinds_still_have_views_with_the_schema(tmp_path):
    with StoreWriter(tmp_path) as w:
        w.write_rows("metric", [{"job": "r", "rank": 0, "step": 0, "name": "loss", "value": 1.0}])
    con = open_store(tmp_path)
    assert con.sql("select count(*) from tensors").fetchall()[0][0] == 0
    assert con.sql("describe tensors").fetchall()[0][0] == "run"


def test_end_step_makes_records_readable_while_the_writer_is_open(tmp_path):
    w = StoreWriter(tmp_path)
    w.write_rows("metric", [{"job": "r", "rank": 0, "step": 0, "name": "loss", "value": 1.0}])
    w.end_step(0)
    assert open_store(tmp_path).execute("select count(*) from metrics").fetchone()[0] == 1
    w.write_rows("metric", [{"job": "r", "rank": 0, "step": 1, "name": "loss", "value": 1.0}])
    assert open_store(tmp_path).execute("select count(*) from metrics").fetchone()[0] == 1
    w.close()


def test_a_full_buffer_spills_a_segment_so_memory_stays_bounded(tmp_path):
    w = StoreWriter(tmp_path, max_buffer_rows=100)
    for i in range(5):
        w.write_rows("metric", [{"job": "r", "rank": 0, "step": 0, "name": f"m{j}", "value": 1.0}
                                for j in range(60)])
    assert w.segments_written >= 2
    w.close()
    assert open_store(tmp_path).execute("select count(*) from metrics").fetchone()[0] == 300


def test_two_writers_of_one_rank_never_overwrite_each_other(tmp_path):
    for value in (1.0, 2.0):
        with StoreWriter(tmp_path, rank=0) as w:
            w.write_rows("metric", [{"job": "r", "rank": 0, "step": 0, "name": "loss", "value": value}])
    assert sorted(open_store(tmp_path).sql("select value from metrics").fetchall()) == [(1.0,), (2.0,)]


def test_a_writer_rejects_columns_outside_the_schema(tmp_path):
    w = StoreWriter(tmp_path)
    with pytest.raises(ValueError):
        w.write("metric", pa.table({"nonsense": [1]}))


def test_schemas_are_the_four_record_kinds():
    assert set(SCHEMAS) == {"tensor", "node", "event", "metric"}
    assert table_from_rows("event", []).num_rows == 0


@pytest.mark.parametrize("make", ["missing", "file", "empty"])
def test_open_store_on_a_bad_path_names_it(tmp_path, make):
    path = tmp_path / "x"
    if make == "file":
        path.write_text("hello")
    elif make == "empty":
        path.mkdir()
    with pytest.raises(ProbeError) as err:
        open_store(path)
    assert str(path) in str(err.value)


def test_a_run_killed_with_sigkill_keeps_every_finished_step(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "probe.cli", "train", "--max-steps", "100000",
                             "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if len(find_segments(out)["metric"]) >= 5:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run wrote no steps in 120 s")
        finished_before_kill = len(find_segments(out)["metric"])
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    result = run_probe("query", str(out), "select count(distinct step), min(step), max(step) from steps", "--csv")
    assert result.returncode == 0, result.stderr
    count, lo, hi = (int(v) for v in result.stdout.strip().splitlines()[1].split(","))
    assert count >= finished_before_kill and lo == 0 and hi == count - 1
    full = run_probe("query", str(out), "select count(*) from steps where loss is null", "--csv")
    assert full.stdout.strip().splitlines()[1] == "0"


def _three_steps(tmp_path):
    with StoreWriter(tmp_path) as w:
        for step in range(3):
            w.write_rows("metric", [{"job": "r", "rank": 0, "step": step, "name": "loss", "value": 1.0}])
            w.end_step(step)
    return find_segments(tmp_path)["metric"]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_segment_is_skipped_with_a_warning_naming_it(tmp_path, logged, damage):
    segments = _three_steps(tmp_path)
    bad = segments[1]
    data = open(bad, "rb").read()
    with open(bad, "wb") as f:
        f.write({"truncated": data[:len(data) // 2], "garbage": b"not parquet" * 50, "empty": b""}[damage])
    assert open_store(tmp_path).sql("select step from steps order by step").fetchall() == [(0,), (2,)]
    err = logged()
    assert bad in err and "skipped" in err and err.count("\n") == 1


def test_a_segment_mended_after_a_skip_is_read_again(tmp_path):
    segments = _three_steps(tmp_path)
    good = open(segments[0], "rb").read()
    with open(segments[0], "wb") as f:
        f.write(b"junk")
    _, skipped = load_segments(tmp_path)
    assert len(skipped) == 1 and skipped[0].startswith(segments[0])
    with open(segments[0], "wb") as f:
        f.write(good)
    assert load_segments(tmp_path) == ({"tensor": [], "node": [], "event": [], "metric": segments}, [])
