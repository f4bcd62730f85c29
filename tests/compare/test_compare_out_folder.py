"""``probe compare --out DIR`` claims its folder as every verb does (probe.ground.outdir): a
user's own file of a result's name stops it with one line (``--force`` replaces it), an earlier
compare's result is replaced; every file is written under a temporary name and moved into place
whole, so a compare that fails or is interrupted leaves no file cut short; a reader refuses a
folder whose parts come from different compares (issue #33, finding 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from probe.cli import main
from probe.compare import report
from probe.compare.api import load_result
from probe.ground.errors import ProbeError
from tests.compare.dumps import chain, write_dump

pytestmark = pytest.mark.timeout(120)

RESULT = {"compare.csv", "compare_msprobe.csv", "compare.parquet", "nodes.parquet", "summary.json"}


@pytest.fixture
def pair(tmp_path):
    data, construct = chain(3)
    a = write_dump(tmp_path / "a", data, construct)
    data_b, construct_b = chain(3, scale={1: 1.5})
    b = write_dump(tmp_path / "b", data_b, construct_b)
    return a, b


def _files(folder) -> set[str]:
    return {n for n in os.listdir(folder) if not n.startswith(".probe-outputs.json")}


def test_a_users_own_summary_json_stops_the_compare_and_force_replaces_it(tmp_path, capsys, pair):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("my notes\n")
    assert main(["compare", str(pair[0]), str(pair[1]), "--out", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and str(out / "summary.json") in err[0] and "--force" in err[0], err
    assert (out / "summary.json").read_text() == "my notes\n"
    assert _files(out) == {"summary.json"}
    assert main(["compare", str(pair[0]), str(pair[1]), "--out", str(out), "--force"]) == 0
    assert _files(out) == RESULT
    load_result(out)


def test_an_earlier_compare_is_replaced_and_the_users_other_files_stay(tmp_path, pair):
    out = tmp_path / "out"
    assert main(["compare", str(pair[0]), str(pair[1]), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    assert subprocess.run([sys.executable, "-m", "probe.cli", "compare", str(pair[1]), str(pair[0]),
                           "--out", str(out)], capture_output=True, text=True).returncode == 0
    assert _files(out) == RESULT | {"notes.txt"}
    assert load_result(out).summary["a"] == str(pair[1])


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), KeyboardInterrupt()])
def test_a_compare_failing_while_it_writes_leaves_no_file_cut_short(tmp_path, capsys, pair, monkeypatch, error):
    out = tmp_path / "out"
    real = report._write_csv

    def half(rows, path):
        real(rows, path)
        with open(path, "r+b") as f:        # what a kill midway leaves: the file cut short
            f.truncate(os.path.getsize(path) // 2)
        raise error
    monkeypatch.setattr(report, "_write_csv", half)
    rc = main(["compare", str(pair[0]), str(pair[1]), "--out", str(out)])
    assert rc == (130 if isinstance(error, KeyboardInterrupt) else 2)
    assert not out.exists()                 # made by this compare, nothing whole in it: removed
    with pytest.raises(ProbeError, match="missing"):
        load_result(out)


def test_a_folder_mixing_parts_of_two_compares_is_refused(tmp_path, pair):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["compare", str(pair[0]), str(pair[1]), "--out", str(one)]) == 0
    assert main(["compare", str(pair[1]), str(pair[0]), "--out", str(two)]) == 0
    load_result(one)
    shutil.copy(two / "nodes.parquet", one / "nodes.parquet")
    with pytest.raises(ProbeError, match="not from the same compare"):
        load_result(one)


def test_temporary_files_of_a_killed_compare_are_swept(tmp_path, pair):
    out = tmp_path / "out"
    assert main(["compare", str(pair[0]), str(pair[1]), "--out", str(out)]) == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = out / f".probe-tmp-{dead.pid}-compare.csv"
    left.write_text("half")
    live = out / f".probe-tmp-{os.getppid()}-compare.csv"       # a live process's: not ours to remove
    live.write_text("busy")
    assert main(["compare", str(pair[0]), str(pair[1]), "--out", str(out)]) == 0
    assert not left.exists() and live.exists()
    assert _files(out) == RESULT | {live.name}


def test_a_bad_input_leaves_no_output_folder_behind(tmp_path, monkeypatch, capsys):
    """Bad input is one line and exit 2, and nothing is written: the default ``compare_out``
    the claim made in the working folder is taken away again."""
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(bad), str(bad)]) == 2
    assert sorted(os.listdir(tmp_path)) == ["bad.json"]
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's")
    assert main(["compare", str(bad), str(bad), "--out", str(kept)]) == 2
    assert [n for n in sorted(os.listdir(kept)) if not n.startswith(".probe-outputs")] == ["notes.txt"]
