"""The SQL sandbox: untrusted SQL reads the run's views and nothing else, within its limits."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from probe.collectors.sql_sandbox import Limits, check_statement, run_untrusted
from probe.collectors.store import StoreWriter
from probe.ground.errors import ProbeError


@pytest.fixture
def run_dir(tmp_path):
    with StoreWriter(tmp_path / "run", rank=0, run="r") as w:
        w.write_rows("tensor", [{"run": "r", "rank": 0, "step": 0, "seq": i, "node": f"Module.m{i}.forward.0",
                                 "node_kind": "module", "direction": "forward", "slot": "output"}
                                for i in range(5)])
        w.write_rows("metric", [{"job": "r", "rank": 0, "step": 0, "name": "loss", "value": 2.5}])
    return tmp_path / "run"


def test_a_select_over_the_views_answers(run_dir):
    assert run_untrusted(run_dir, "select count(*) from tensors").rows == [(5,)]
    result = run_untrusted(run_dir, "with s as (select * from steps) select step, loss from s")
    assert result.columns == ["step", "loss"] and result.rows == [(0, 2.5)] and not result.truncated


@pytest.mark.parametrize("sql", [
    "select content from read_text('/etc/hostname')",
    "select * from read_csv('/etc/passwd')",
    "select * from read_blob('/etc/hostname')",
    "select * from glob('/etc/*')",
    "select * from read_parquet('{outside}')",
    "select * from read_parquet('{store}/../../../outside.parquet')",
])
def test_files_outside_the_store_are_refused(run_dir, tmp_path, sql):
    outside = tmp_path / "outside.parquet"          # a real Parquet file beside the run
    pq.write_table(pa.table({"secret": [1]}), outside)
    store = os.path.join(run_dir, "store", "metric", "rank0")
    with pytest.raises(ProbeError, match="SQL refused: Permission Error"):
        run_untrusted(run_dir, sql.format(outside=outside, store=store))


@pytest.mark.parametrize("sql, kind", [
    ("copy (select 1) to '{target}'", "COPY"),
    ("copy tensors to '{target}'", "COPY"),
    ("attach '{target}' as other", "ATTACH"),
    ("install httpfs", "LOAD"),
    ("load httpfs", "LOAD"),
    ("set enable_external_access = true", "SET"),
    ("reset lock_configuration", "SET"),
    ("pragma enable_profiling", "PRAGMA"),
    ("create table t as select 1", "CREATE"),
    ("export database '{target}'", "EXPORT"),
    ("call pragma_version()", "CALL"),
])
def test_statements_other_than_select_are_refused_and_write_nothing(run_dir, tmp_path, sql, kind):
    target = tmp_path / "written"
    with pytest.raises(ProbeError, match=f"SQL refused: .*not {kind}$"):
        run_untrusted(run_dir, sql.format(target=target))
    assert not target.exists()


def test_settings_stay_locked_even_inside_a_select(run_dir):
    rows = run_untrusted(run_dir, "select current_setting('enable_external_access'), "
                                  "current_setting('lock_configuration')").rows
    assert rows == [(False, True)]


def test_two_statements_at_once_are_refused():
    with pytest.raises(ProbeError, match="one statement at a time"):
        check_statement("select 1; drop view tensors")


def test_a_query_past_the_time_limit_is_interrupted(run_dir):
    start = time.monotonic()
    with pytest.raises(ProbeError, match="ran past the sandbox's limit of 0.5 s"):
        run_untrusted(run_dir, "select count(*) from range(100000000) a, range(100000) b", Limits(timeout_s=0.5))
    assert time.monotonic() - start < 10


def test_rows_past_the_limit_are_cut_and_said_so(run_dir):
    result = run_untrusted(run_dir, "select * from range(100)", Limits(max_rows=7))
    assert len(result.rows) == 7 and result.truncated


def test_a_corrupt_segment_is_left_out_and_reported(run_dir):
    bad = run_dir / "store" / "metric" / "rank0" / "seg-0-broken-00000009.parquet"
    bad.write_bytes(b"PAR1 torn")
    result = run_untrusted(run_dir, "select count(*) from tensors")
    assert result.rows == [(5,)] and len(result.skipped) == 1 and str(bad) in result.skipped[0]


@pytest.mark.parametrize("sql", [
    "select * from glob('{cwd}/.tmp/*')",
    "select * from read_csv('{cwd}/.tmp/secret.csv')",
    "select current_setting('temp_directory') as t, current_setting('allowed_directories') as a",
])
def test_duckdbs_temporary_folder_is_not_readable_from_the_sandbox(run_dir, tmp_path, monkeypatch, sql):
    (tmp_path / ".tmp").mkdir()                     # DuckDB's default temporary folder: <cwd>/.tmp
    (tmp_path / ".tmp" / "secret.csv").write_text("secret\n42\n")
    monkeypatch.chdir(tmp_path)
    if "current_setting" in sql:
        (temp, allowed), = run_untrusted(run_dir, sql).rows
        assert temp == "" and all(a.startswith(str(run_dir.resolve() / "store")) for a in allowed), allowed
        return
    with pytest.raises(ProbeError, match="SQL refused: Permission Error"):
        run_untrusted(run_dir, sql.format(cwd=tmp_path))


def test_sql_longer_than_the_limit_is_refused_before_it_is_parsed(run_dir):
    with pytest.raises(ProbeError, match=r"SQL refused: 100010 characters, over the sandbox's limit of 100000"):
        run_untrusted(run_dir, "select 1" + " " * 100_002)
    started = time.monotonic()
    with pytest.raises(ProbeError, match="over the sandbox's limit"):
        run_untrusted(run_dir, "select " + "1+" * 5_000_000 + "1")
    assert time.monotonic() - started < 1.0
    assert run_untrusted(run_dir, "select 1", Limits(max_sql_chars=8)).rows == [(1,)]
