"""``probe dump`` end to end: the bundled engine, scripts, ranks, the store, and msprobe's own tools."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_probe

MSPROBE_PY = Path(os.environ.get("PROBE_MSPROBE_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))


def _keys(out: Path, step: int = 0, rank: int = 0) -> list[str]:
    return list(json.loads((out / f"step{step}/rank{rank}/dump.json").read_text())["data"])


def test_bundled_engine_dumps_only_the_selected_steps_and_runs_until_the_last(tmp_path):
    out = tmp_path / "d"
    r = run_probe("dump", "--steps", "1,2", "--preset", "tiny", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.glob("step*")) == ["step1", "step2"]
    keys = _keys(out, 1)
    assert "Module.layers.0.attn.q_proj.Linear.forward.0" in keys
    assert "Module.lm_head.Linear.parameters_grad.0" in keys
    summary = json.loads((out / "dump_summary.json").read_text())
    assert summary["steps"] == [1, 2] and summary["ranks"] == [0]
    q = run_probe("query", str(out), "select distinct step from tensors order by step", "--csv")
    assert q.returncode == 0 and q.stdout.split() == ["step", "1", "2"]
    q = run_probe("query", str(out), "select count(*) from metrics where name = 'loss'", "--csv")
    assert q.stdout.split()[-1] == "3"          # the engine ran steps 0..2


def test_bad_input_is_one_line_without_traceback(tmp_path):
    for args, needle in ((("--steps", "x-1"), "--steps"), (("--scope", "(unclosed"), "--scope"),
                         (("--steps", "5", "--max-steps", "2"), "--max-steps"),
                         (("--out", str(tmp_path), "--", str(tmp_path / "missing.py")), "missing.py")):
        r = run_probe("dump", *args)
        assert r.returncode == 2, r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_script_mode_hooks_every_model_and_counts_steps_from_the_optimizer(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        from torch import nn
        assert sys.argv[1:] == ["--lr", "0.1"]
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(net.parameters(), lr=float(sys.argv[2]))
        for step in range(3):
            loss = net(torch.randn(5, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        print("trained")
    """))
    out = tmp_path / "d"
    r = run_probe("dump", "--level", "mix", "--steps", "0,2", "--out", str(out), "--",
                  str(script), "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout
    assert sorted(p.name for p in out.glob("step*")) == ["step0", "step2"]
    keys = _keys(out, 2)
    assert {"Module.0.Linear.forward.0", "Module.2.Linear.backward.0", "Functional.linear.0.forward",
            "Functional.relu.0.forward"} <= set(keys)
    assert any(k.startswith("Tensor.") and k.endswith(".forward") for k in keys)   # optimizer update


def test_script_that_raises_keeps_finished_steps_and_exits_1(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        net = nn.Sequential(nn.Linear(2, 2))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(3):
            if step == 2:
                raise ValueError("bad batch")
            net(torch.ones(1, 2)).sum().backward()
            opt.step()
    """))
    out = tmp_path / "d"
    r = run_probe("dump", "--out", str(out), "--", str(script))
    assert r.returncode == 1
    assert "ValueError: bad batch" in r.stderr and "crash.py:8" in r.stderr
    assert "Traceback" not in r.stderr
    for step in (0, 1):
        assert "Module.0.Linear.forward.0" in _keys(out, step)


@pytest.mark.slow
def test_two_ranks_each_write_their_own_files(tmp_path):
    out = tmp_path / "d"
    r = run_probe("dump", "--nproc", "2", "--level", "mix", "--steps", "0", "--preset", "tiny",
                  "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        keys = _keys(out, 0, rank)
        assert "Module.layers.1.mlp.down_proj.Linear.forward.0" in keys
        assert "Distributed.all_reduce.0.forward" in keys
    q = run_probe("query", str(out), "select count(distinct rank) from tensors", "--csv")
    assert q.stdout.split()[-1] == "2"


def _msprobe_ready() -> bool:
    if not MSPROBE_PY.exists():
        return False
    r = subprocess.run([str(MSPROBE_PY), "-c", "import torch, msprobe.pytorch"], capture_output=True)
    return r.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _msprobe_ready(), reason=f"mindstudio-probe with torch not found at {MSPROBE_PY}")
def test_msprobe_compare_and_graph_tools_accept_our_dumps_and_find_a_planted_fault(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    assert run_probe("dump", "--steps", "0", "--out", str(good)).returncode == 0
    r = run_probe("dump", "--steps", "0", "--out", str(bad),
                  "--fault", "scale:layers.1.mlp.up_proj.weight:1.5")
    assert r.returncode == 0, r.stderr
    msprobe = MSPROBE_PY.parent / "msprobe"
    res = subprocess.run([str(msprobe), "compare", "-tp", str(bad / "step0"), "-gp", str(good / "step0"),
                          "-o", str(tmp_path / "cmp")], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    [result] = list((tmp_path / "cmp").glob("compare_result_rank0_*.csv"))
    rows = list(csv.DictReader(result.open()))
    names = {row["NPU Name"] for row in rows}
    assert len(rows) > 100 and "Module.layers.0.attn.q_proj.Linear.forward.0.output.0" in names
    flagged = {row["NPU Name"] for row in rows if row["Result"] != "pass"}
    assert "Module.layers.1.mlp.up_proj.Linear.backward.0.output.0" in flagged
    assert not any(n.startswith("Module.layers.0.") and ".forward." in n for n in flagged)
    vis = subprocess.run([str(msprobe), "graph_visualize", "-tp", str(bad / "step0"), "-gp",
                          str(good / "step0"), "-o", str(tmp_path / "vis")],
                         capture_output=True, text=True, timeout=600)
    assert vis.returncode == 0, vis.stdout[-2000:]
    assert list((tmp_path / "vis").glob("compare_*.vis.db"))


def test_dump_verb_is_listed_and_documents_its_options():
    r = run_probe("dump", "--help")
    assert r.returncode == 0
    for opt in ("--level", "--task", "--steps", "--ranks", "--scope", "--framework", "--out", "--engine"):
        assert opt in r.stdout
