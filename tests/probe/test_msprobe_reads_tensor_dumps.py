"""msprobe's own compare reads the ``tensor`` task's files (issue #32): real cosines, not
"unsupported", and the call that computes differently is the one it flags.

msprobe runs in the Python that has it installed (``.venv-bench``, made by ``scripts/test.sh``;
``PROBE_MSPROBE_PYTHON`` points elsewhere); without it the test is skipped.
"""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from probe.dumper.session import DumpSession
from tests.conftest import ROOT

MSPROBE_PY = Path(os.environ.get("PROBE_MSPROBE_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))


def _msprobe_ready() -> bool:
    if not MSPROBE_PY.exists() or not (MSPROBE_PY.parent / "msprobe").exists():
        return False
    r = subprocess.run([str(MSPROBE_PY), "-c", "import torch, msprobe.pytorch"], capture_output=True)
    return r.returncode == 0


class Shift(nn.Module):
    """A step whose computation differs between the runs (its inputs and parameters do not)."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) + self.shift * x.square()


def _dump(out: Path, shift: float, level: str) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), Shift(shift), nn.Linear(8, 3))
    x = torch.linspace(-1, 1, 8).reshape(2, 4)
    with DumpSession(net, out=out, task="tensor", level=level, store=False, auto_step=False):
        net(x).square().sum().backward()


def _msprobe_compare(tmp_path: Path, level: str) -> dict[str, dict]:
    good, bad = tmp_path / "good", tmp_path / "bad"
    _dump(good, 0.0, level)
    _dump(bad, 0.5, level)
    assert all(p.suffix == ".pt" for p in (bad / "step0" / "rank0" / "dump_tensor_data").iterdir())
    res = subprocess.run([str(MSPROBE_PY.parent / "msprobe"), "compare", "-tp", str(bad / "step0"),
                          "-gp", str(good / "step0"), "-o", str(tmp_path / "cmp")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "should be" not in res.stdout + res.stderr          # "... should be .pt"
    [result] = list((tmp_path / "cmp").glob("compare_result_rank0_*.csv"))
    return {row["NPU Name"]: row for row in csv.DictReader(result.open())}


@pytest.mark.slow
@pytest.mark.skipif(not _msprobe_ready(), reason=f"msprobe with torch not found at {MSPROBE_PY}")
@pytest.mark.parametrize("level", ["module", "mix"])
def test_msprobe_compare_reads_our_tensor_files_and_flags_the_differing_call(tmp_path, level):
    rows = _msprobe_compare(tmp_path, level)
    modules = {n: r for n, r in rows.items() if n.startswith("Module.")}
    assert "Module.0.Linear.forward.0.parameters.weight" in modules
    assert "Module.2.Linear.parameters_grad.0.weight" in modules
    for name, row in modules.items():                 # every module tensor's data was read
        assert row["Cosine"] not in ("unsupported", "N/A", ""), (name, row["Cosine"], row["Err_message"])
        float(row["Cosine"])
    same = ("Module.0.Linear.forward.0.input.0", "Module.0.Linear.forward.0.output.0",
            "Module.1.Shift.forward.0.input.0", "Module.0.Linear.forward.0.parameters.weight")
    for name in same:
        assert float(rows[name]["Cosine"]) == pytest.approx(1.0) and float(rows[name]["MaxAbsErr"]) == 0, name
        assert rows[name]["Result"] == "pass", name
    planted = rows["Module.1.Shift.forward.0.output.0"]
    assert float(planted["Cosine"]) < 0.99 and float(planted["MaxAbsErr"]) > 0.1
    assert planted["Result"] not in ("pass", ""), planted
    flagged = {n for n, r in modules.items() if r["Result"] not in ("pass", "")}
    assert not any(n.startswith("Module.0.Linear.forward.") for n in flagged)
