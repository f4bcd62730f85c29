"""``probe check-api`` end to end on dumps of the bundled engine: fp32, bf16, a planted wrong kernel.

The dumps and most checks run ``probe`` in this process (:func:`tests.checker.conftest.probe_here`);
the planted kernel's check runs as its own process, so the exit code a shell sees is proved too.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from tests.checker.conftest import probe_here
from tests.conftest import run_probe

pytestmark = pytest.mark.slow

ELEMENTWISE = ("Tensor.__add__", "Tensor.__mul__", "Tensor.__truediv__", "Functional.silu", "Tensor.__neg__",
               "Tensor.__getitem__", "Tensor.reshape", "Tensor.transpose", "Torch.cat")
LOWER = "computed in bfloat16 from float32 inputs"


def _dump(out: Path, *extra: str) -> Path:
    r = probe_here("dump", "--level", "api", "--task", "tensor", "--steps", "0", "--out", str(out), *extra)
    assert r.returncode == 0, r.stderr
    return out


def _check(dump: Path, out: Path, *extra: str) -> tuple[list[dict], dict, str]:
    r = probe_here("check-api", str(dump), "--out", str(out), *extra)
    assert r.returncode in (0, 1), r.stderr
    rows = pq.read_table(out / "check_api.parquet").to_pylist()
    return rows, json.loads((out / "summary.json").read_text()), r.stdout


@pytest.fixture(scope="module")
def fp32_dump(tmp_path_factory) -> Path:
    return _dump(tmp_path_factory.mktemp("fp32") / "dump")


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
    dump = _dump(tmp_path / "dump", "--fault", "perturb:Functional.linear:3")
    r = run_probe("check-api", str(dump), "--out", str(tmp_path / "c"), "--fail-on", "error")
    assert r.returncode == 1, r.stderr                 # a call graded error: exit 1, in a real process
    rows = pq.read_table(tmp_path / "c" / "check_api.parquet").to_pylist()
    first = json.loads((tmp_path / "c" / "summary.json").read_text())["first_failure"]
    assert first["name"] == "Functional.linear.3.forward" and first["verdict"] == "error"
    assert "biased away from zero" in first["reason"]
    assert [r["name"] for r in rows if r["verdict"] in ("error", "nan")] == ["Functional.linear.3.forward"]
    assert rows[0]["name"] == "Functional.linear.3.forward"        # sorted by severity
    assert "first failing call: Functional.linear.3.forward" in r.stdout


def test_bf16_run_flags_where_autocast_rounds_float32_inputs_and_grades_norms_as_the_float32_calls_they_are(
        tmp_path):
    # The engine's bf16 is autocast (float32 weights): linear and scaled_dot_product_attention (the
    # softmax attention) take float32 inputs and return bfloat16, so they lose precision and are
    # flagged, saying so. The residual stream stays float32 (embedding output, bf16 + fp32 sums),
    # so every RMSNorm runs in float32: graded, and passing, as a float32 reduction, not waved
    # through as a bf16 one.
    dump = _dump(tmp_path / "dump", "--dtype", "bf16", "--engine", "fused")
    rows, summary, _ = _check(dump, tmp_path / "c")
    flagged = [r for r in rows if r["verdict"] in ("warning", "error", "nan")]
    assert {r["api"] for r in flagged} == {"Functional.linear", "Functional.scaled_dot_product_attention"}
    assert all(r["op"] in ("matmul", "attention") and r["dtype"] == "torch.bfloat16" and LOWER in r["reason"]
               for r in flagged), [(r["name"], r["reason"]) for r in flagged]
    assert all(r["verdict"] != "pass" for r in rows if r["api"] == "Functional.linear")
    norms = [r for r in rows if r["api"] == "Functional.rms_norm"]
    assert len(norms) == 5 and all(
        r["dtype"] == "torch.float32" and r["verdict"] == "pass" and r["k"] == 64
        and r["reason"].startswith("within the float32 standard for a 64-term reduction") for r in norms), norms
    bf16 = [r for r in rows if r["dtype"] == "torch.bfloat16" and r["verdict"] != "skipped"]
    elementwise = [r for r in bf16 if r["api"] in ELEMENTWISE]
    assert elementwise and all(r["verdict"] == "pass" for r in elementwise)
    assert summary["first_failure"]["api"] in {r["api"] for r in flagged}


def _script_dump(out: Path, level: str, task: str) -> Path:
    """A dump of a user's script (probe.dump around a small model): in milliseconds."""
    from probe.dumper.session import DumpSession

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    with DumpSession(net, out=str(out), level=level, task=task, auto_step=False, store=False, quiet=True):
        net(torch.randn(8, 16)).sum().backward()
    return out


def test_bad_input_is_one_line_without_traceback(fp32_dump, tmp_path):
    stats = _script_dump(tmp_path / "stats", "api", "statistics")
    module = _script_dump(tmp_path / "module", "module", "tensor")
    broken = tmp_path / "broken" / "step0" / "rank0"
    broken.mkdir(parents=True)
    (broken / "dump.json").write_text('{"task": "tensor", "data": {"Torch.exp.0.forward": ')
    for args, needle in (((str(tmp_path / "missing"),), "no such dump directory"),
                         ((str(stats),), "holds no tensors"),
                         ((str(tmp_path / "broken"),), "not valid JSON"),
                         ((str(module),), "records no API call"),
                         ((str(fp32_dump), "--golden", "tpu"), "--golden")):
        r = probe_here("check-api", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
