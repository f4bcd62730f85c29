"""probe compare's command line: bad input is one line naming the file; mapping files."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.compare.dumps import chain, write_dump
from tests.conftest import run_probe


def _error_line(p) -> str:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


@pytest.mark.parametrize("text, word", [
    ('{"task": "statistics", "data": {"Module.a.Linear.forward.0": {"input_args": [{"dtype"', "truncated"),
    ('{"data": 5}', "not an msprobe dump.json"),
    ('{"task": "statistics", "data": {}}', "empty dump"),
])
def test_bad_dump_is_one_line_naming_the_file(tmp_path, text, word):
    good = write_dump(tmp_path / "good", *chain(2))
    bad = tmp_path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_text(text)
    line = _error_line(run_probe("compare", str(good), str(bad), "--out", str(tmp_path / "o")))
    assert str(bad) in line and word in line


def test_missing_input_and_empty_folder_are_one_line(tmp_path):
    good = write_dump(tmp_path / "good", *chain(2))
    assert "no such file" in _error_line(run_probe("compare", str(good), str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    assert "no dump.json" in _error_line(run_probe("compare", str(tmp_path / "empty"), str(good)))


def test_mapping_that_names_nothing_is_one_line_naming_the_file(tmp_path):
    a = write_dump(tmp_path / "a", *chain(2))
    b = write_dump(tmp_path / "b", *chain(2))
    m = tmp_path / "cell_mapping.yaml"
    m.write_text(yaml.safe_dump({"no_such.Module": "other.Linear"}))
    line = _error_line(run_probe("compare", str(a), str(b), "--mapping", str(m)))
    assert str(m) in line and "names nothing" in line


def test_layer_mapping_renames_scopes_by_class(tmp_path):
    da, ca = chain(3, names=["blk.fc", "blk", "head"], prefix="Cell", cls="Dense")
    db, cb = chain(3, names=["block.proj", "block", "out"])
    m = tmp_path / "layer_mapping.yaml"
    m.write_text(yaml.safe_dump({"TopLayer": {"blk": "block", "head": "out"}, "Dense": {"fc": "proj"}}))
    p = run_probe("compare", str(write_dump(tmp_path / "a", da, ca)), str(write_dump(tmp_path / "b", db, cb)),
                  "--mapping", str(m), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["match_methods"] == {"mapping": 6} and s["unmatched_a"] == 0 and set(s["verdicts"]) == {"pass"}


def test_data_mapping_pairs_named_tensors(tmp_path):
    da, ca = chain(2, names=["x.fc", "y.fc"])
    db, cb = chain(2, names=["p.lin", "q.lin"])
    m = tmp_path / "data_mapping.yaml"
    m.write_text(yaml.safe_dump({"Module.x.fc.Linear.forward.0.input.0": "Module.p.lin.Linear.forward.0.input.0",
                                 "Module.y.fc.Linear.forward.0.output.0": "Module.q.lin.Linear.forward.0.output.0"}))
    p = run_probe("compare", str(write_dump(tmp_path / "a", da, ca)), str(write_dump(tmp_path / "b", db, cb)),
                  "--mapping", str(m), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["match_methods"] == {"mapping": 4} and set(s["verdicts"]) == {"pass"}


def test_summary_on_the_terminal_names_counts_and_findings(tmp_path):
    a = write_dump(tmp_path / "a", *chain(3))
    b = write_dump(tmp_path / "b", *chain(3, scale={1: 2.0}))
    p = run_probe("compare", str(a), str(b), "--out", str(tmp_path / "o"), "--fail-on", "warning")
    assert p.returncode == 1
    assert "matched 6 nodes" in p.stdout and "first divergence (forward): Module.layers.1.fc" in p.stdout
    assert "worst pairs" in p.stdout


def test_large_compare_csv_in_parallel_chunks_equals_one_piece(tmp_path, monkeypatch):
    from pathlib import Path

    import probe.compare.report as report
    from probe.compare.api import compare

    a = write_dump(tmp_path / "a", *chain(40))
    b = write_dump(tmp_path / "b", *chain(40, scale={3: 1.5}))
    rows = compare(str(a), str(b)).rows
    report._write_csv(rows, tmp_path / "one.csv")
    monkeypatch.setattr(report, "CSV_PARALLEL_ROWS", 0)
    monkeypatch.setattr(report, "CSV_PARALLEL_CORES", 1)       # chunked on any machine
    monkeypatch.setattr(report, "CSV_CHUNK_ROWS", 7)           # many chunks, one header
    report._write_csv(rows, tmp_path / "chunks.csv")
    one, chunks = Path(tmp_path / "one.csv").read_bytes(), Path(tmp_path / "chunks.csv").read_bytes()
    assert rows.num_rows > 7 * 3 and one == chunks


def test_compare_process_setup_keeps_the_users_settings(monkeypatch):
    import os

    from probe.commands.compare import setup_process

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    setup_process()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"      # set by the user: kept
