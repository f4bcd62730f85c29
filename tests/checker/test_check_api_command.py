"""``probe check-api`` end to end on dumps of the bundled engine: fp32, bf16, a planted wrong kernel."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_probe

pytestmark = pytest.mark.slow

ELEMENTWISE = ("Tensor.__add__", "Tensor.__mul__", "Tensor.__truediv__", "Functional.silu", "Tensor.__neg__",
               "Tensor.__getitem__", "Tensor.reshape", "Tensor.transpose", "Torch.cat")


def _dump(root: Path, *extra: str) -> Path:
    out = root / "dump"
    r = run_probe("dump", "--level", "api", "--task", "tensor", "--steps", "0", "--out", str(out), *extra)
    assert r.returncode == 0, r.stderr
    return out


def _check(dump: Path, out: Path, *extra: str) -> tuple[list[dict], dict, str]:
    r = run_probe("check-api", str(dump), "--out", str(out), *extra)
    assert r.returncode in (0, 1), r.stderr
    rows = pq.read_table(out / "check_api.parquet").to_pylist()
    return rows, json.loads((out / "summary.json").read_text()), r.stdout


@pytest.fixture(scope="module")
def fp32_dump(tmp_path_factory) -> Path:
    return _dump(tmp_path_factory.mktemp("fp32"))


def test_fp32_run_passes_every_replayable_call_and_lists_the_rest_as_skipped_with_why(fp32_dump, tmp_path):
    rows, summary, stdout = _check(fp32_dump, tmp_path / "c")
    graded = [r for r in rows if r["verdict"] != "skipped"]
    assert len(graded) > 300 and all(r["verdict"] == "pass" for r in graded), \
        [(r["name"], r["reason"]) for r in graded if r["verdict"] != "pass"][:5]
    assert summary["first_failure"] is None and "no failing call" in stdout
    skipped = {r["reason"].split(":")[0] for r in rows if r["verdict"] == "skipped"}
    assert skipped <= {"in-place", "random", "not replayable"} and "in-place" in skipped
    assert summary["counts"]["pass"] == len(graded) and summary["calls"] == len(rows)
    with open(tmp_path / "c" / "check_api.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header[:11] == ["step", "rank", "order", "name", "api", "op", "dtype", "shape", "k", "verdict", "reason"]
    assert {"max_ulp", "rel_err", "cosine", "balance"} <= set(header)


def test_a_planted_wrong_kernel_is_the_first_failing_call_by_name(tmp_path):
    dump = _dump(tmp_path, "--fault", "perturb:Functional.linear:3")
    rows, summary, stdout = _check(dump, tmp_path / "c", "--fail-on", "error")
    first = summary["first_failure"]
    assert first["name"] == "Functional.linear.3.forward" and first["verdict"] == "error"
    assert "biased away from zero" in first["reason"]
    assert [r["name"] for r in rows if r["verdict"] in ("error", "nan")] == ["Functional.linear.3.forward"]
    assert rows[0]["name"] == "Functional.linear.3.forward"        # sorted by severity
    assert "first failing call: Functional.linear.3.forward" in stdout


def test_bf16_run_flags_the_long_reductions_and_passes_the_elementwise_ops(tmp_path):
    dump = _dump(tmp_path, "--dtype", "bf16", "--engine", "fused")
    rows, summary, _ = _check(dump, tmp_path / "c")
    bf16 = [r for r in rows if r["dtype"] == "torch.bfloat16" and r["verdict"] != "skipped"]
    flagged = {r["api"] for r in bf16 if r["verdict"] in ("warning", "error")}
    assert {"Functional.linear", "Functional.scaled_dot_product_attention"} <= flagged
    assert all(r["op"] in ("matmul", "reduction") for r in bf16 if r["verdict"] != "pass")
    elementwise = [r for r in bf16 if r["api"] in ELEMENTWISE]
    assert elementwise and all(r["verdict"] == "pass" for r in elementwise)
    assert summary["first_failure"]["api"] in flagged


def test_bad_input_is_one_line_without_traceback(fp32_dump, tmp_path):
    stats = tmp_path / "stats"
    assert run_probe("dump", "--level", "api", "--steps", "0", "--out", str(stats)).returncode == 0
    broken = tmp_path / "broken" / "step0" / "rank0"
    broken.mkdir(parents=True)
    (broken / "dump.json").write_text('{"task": "tensor", "data": {"Torch.exp.0.forward": ')
    module = tmp_path / "module"
    assert run_probe("dump", "--task", "tensor", "--steps", "0", "--out", str(module)).returncode == 0
    for args, needle in (((str(tmp_path / "missing"),), "no such dump directory"),
                         ((str(stats),), "holds no tensors"),
                         ((str(tmp_path / "broken"),), "not valid JSON"),
                         ((str(module),), "records no API call"),
                         ((str(fp32_dump), "--golden", "tpu"), "--golden")):
        r = run_probe("check-api", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
