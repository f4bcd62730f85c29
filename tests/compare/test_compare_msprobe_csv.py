"""compare_msprobe.csv under msprobe's column names, compare.xlsx on request, and the tolerance
rule printed with the counts and kept in summary.json."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from probe.compare.api import compare
from probe.compare.msprobe_csv import HEADER, write_xlsx
from probe.ground.errors import ProbeError
from tests.compare.dumps import chain, write_dump
from tests.conftest import run_probe

#: mindstudio-probe 26.2's CompareConst.SUMMARY_COMPARE_RESULT_HEADER (msprobe/core/common/const.py)
MSPROBE_26_2_SUMMARY_HEADER = [
    "NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
    "NPU Requires_grad", "Bench Requires_grad", "Max diff", "Min diff", "Mean diff", "L2norm diff",
    "MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr", "NPU max", "NPU min",
    "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm",
    "Requires_grad Consistent", "Result", "Err_message"]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    a = write_dump(tmp_path / "A", *chain(4))
    data, construct = chain(4, scale={2: 1.5})
    data.pop("Module.layers.3.fc.Linear.backward.0")       # a tensor of A without a counterpart
    return a, write_dump(tmp_path / "B", data, construct)


def test_header_is_msprobes_statistics_header() -> None:
    assert list(HEADER) == MSPROBE_26_2_SUMMARY_HEADER
    try:
        from msprobe.core.common.const import CompareConst
    except ImportError:
        return
    assert list(HEADER) == list(CompareConst.SUMMARY_COMPARE_RESULT_HEADER)


def test_compare_writes_msprobe_columns_beside_compare_csv(pair, tmp_path: Path) -> None:
    r = compare(str(pair[0]), str(pair[1]), out=tmp_path / "out")
    with open(tmp_path / "out" / "compare_msprobe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(tmp_path / "out" / "compare.csv", newline="") as f:
        ours = list(csv.DictReader(f))
    assert list(rows[0]) == MSPROBE_26_2_SUMMARY_HEADER
    assert len(rows) == len(ours) == r.rows.num_rows
    for m, o in zip(rows, ours):                       # the same rows, in the same order
        assert m["NPU Name"] == (o["name_a"] or "N/A") and m["Bench Name"] == (o["name_b"] or "N/A")
        assert m["NPU max"] == o["max_a"] and m["Bench l2norm"] == o["norm_b"]
        assert m["Result"] == ("N/A" if o["verdict"] == "unmatched" else o["verdict"])
        if o["name_b"] and o["name_a"]:            # msprobe's sign: NPU − Bench
            assert math.isclose(float(m["Max diff"]), float(o["max_a"]) - float(o["max_b"]), abs_tol=1e-12)
    bad = next(m for m in rows if m["NPU Name"] == "Module.layers.2.fc.Linear.forward.0.parameters.weight")
    assert bad["MaxRelativeErr"].endswith("%")              # |A − B| / |B| in percent
    assert math.isclose(float(bad["MaxRelativeErr"].rstrip("%")), 100 / 3, rel_tol=1e-9)
    assert bad["Result"] == "error" and float(bad["Max diff"]) == pytest.approx(-0.25)
    lone = [m for m in rows if m["Bench Name"] == "N/A"]
    assert lone and all(m["Err_message"] == "No bench data matched." and m["Result"] == "N/A" for m in lone)


def test_tolerance_rule_is_in_summary_json_and_printed_with_the_counts(pair, tmp_path: Path) -> None:
    p = run_probe("compare", str(pair[0]), str(pair[1]), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("unmatched:"))
    assert lines[at + 1].startswith("tolerance on err") and "float32 pass <= 0.0001, warning <= 0.001" in lines[at + 1]
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["tolerance"]["dtypes"] == {"float32": {"pass": 1e-4, "warning": 1e-3}}
    assert s["tolerance"]["rule"] == lines[at + 1]
    assert "compare_msprobe.csv" in p.stdout


def test_xlsx_without_openpyxl_is_one_line_and_exit_2(pair, tmp_path: Path, monkeypatch) -> None:
    installed = importlib.util.find_spec("openpyxl") is not None
    monkeypatch.setitem(sys.modules, "openpyxl", None)
    r = compare(str(pair[0]), str(pair[1]))
    with pytest.raises(ProbeError, match="pip install openpyxl"):
        write_xlsx(r.rows, tmp_path / "c.xlsx")
    if installed:
        return                       # installed here: the command would write the workbook
    p = run_probe("compare", str(pair[0]), str(pair[1]), "--out", str(tmp_path / "o"), "--xlsx")
    assert p.returncode == 2 and "openpyxl" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()              # refused before any work


def test_xlsx_holds_msprobes_columns(pair, tmp_path: Path) -> None:
    openpyxl = pytest.importorskip("openpyxl")
    p = run_probe("compare", str(pair[0]), str(pair[1]), "--out", str(tmp_path / "o"), "--xlsx")
    assert p.returncode == 0, p.stderr
    ws = openpyxl.load_workbook(tmp_path / "o" / "compare.xlsx").active
    assert [c.value for c in next(ws.iter_rows(max_row=1))] == MSPROBE_26_2_SUMMARY_HEADER
