"""A launcher given as the SCRIPT (``probe dump -- torchrun ... train.py``) hooks every rank and
sums the run up once; forms no rank can be hooked in stop at once; an empty dump is an error."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_probe

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "examples" / "train.py")


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _rank_folders(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.glob("step*/rank*"))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [["torchrun"], [sys.executable, "-m", "torch.distributed.run"]],
                         ids=["torchrun", "python-m"])
def test_probe_dump_of_a_launcher_hooks_every_rank_and_sums_up_once(tmp_path, launcher):
    if launcher == ["torchrun"]:
        launcher = [str(Path(sys.executable).parent / "torchrun")]
    out = tmp_path / "d"
    res = run_probe("dump", "--level", "module", "--out", str(out), "--", *launcher,
                    "--nproc-per-node", "2", "--master-port", _port(), SCRIPT, "--steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert _rank_folders(out) == ["step0/rank0", "step0/rank1", "step1/rank0", "step1/rank1"]
    summaries = [ln for ln in res.stdout.splitlines() if ln.startswith("probe dump:")]
    assert summaries == [f"probe dump: module/statistics: 2 steps (0-1) on 2 ranks, 32 entries -> "
                         f"{out}/step{{N}}/rank{{R}}/dump.json"], res.stdout


@pytest.mark.slow
def test_probe_profile_of_a_launcher_profiles_every_rank(tmp_path):
    out = tmp_path / "p"
    res = run_probe("profile", "--out", str(out), "--", str(Path(sys.executable).parent / "torchrun"),
                    "--nproc-per-node", "2", "--master-port", _port(), SCRIPT, "--steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in (out / "trace").glob("rank*.json")) == ["rank0.json", "rank1.json"]


def test_a_launcher_form_no_rank_can_be_hooked_in_stops_at_once(tmp_path):
    res = run_probe("dump", "--out", str(tmp_path / "d"), "--", "torchrun", "--nproc-per-node", "2",
                    "-m", "my.module")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "probe: error: torchrun -m MODULE: probe hooks a Python script file; give it as 'probe "
        "<verb> ... -- torchrun ... train.py', or run 'torchrun ... -m probe.cli <verb> ... -- "
        "train.py'"]
    assert not (tmp_path / "d").exists()


def test_an_empty_dump_is_an_error_that_says_why(tmp_path):
    script = tmp_path / "leaf.py"
    script.write_text(textwrap.dedent("""
        import torch
        m = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            m(torch.ones(3, 4)).sum().backward(); opt.step(); opt.zero_grad()
        """))
    res = run_probe("dump", "--level", "module", "--steps", "5", "--out", str(tmp_path / "d"), "--",
                    str(script))
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "no step was dumped" in line and "--steps" in line and "leaf module" in line
