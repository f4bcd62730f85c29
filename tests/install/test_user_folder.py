"""A user's repository with files named like the project's rooms (``engine.py``, ``web.py``,
``compare.py``, ``monitor.py``, ``profiler.py``, as DETR/DeiT-style repositories have) is dumped
and profiled through the command line and through the Python API: the project's one import
root ``probe`` takes none of their names."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = Path(sys.executable).parent / "probe"

USER_FILES = {
    "engine.py": """
        import torch

        def train_one_epoch(model, opt, steps):
            losses = []
            for step in range(steps):
                x = torch.full((4, 8), 0.1 * (step + 1))
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(float(loss))
            return losses
        """,
    "web.py": "ROUTE = '/users'\n",
    "compare.py": "def compare(a, b):\n    return a == b\n",
    "monitor.py": "WATCHING = True\n",
    "profiler.py": "def profile():\n    return 'the user profiler'\n",
    "main.py": """
        import sys

        import torch

        import compare, monitor, profiler, web
        from engine import train_one_epoch

        assert compare.compare(1, 1) and monitor.WATCHING and web.ROUTE == '/users'
        assert profiler.profile() == 'the user profiler'
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if len(sys.argv) > 1 and sys.argv[1] == "--api":
            import probe
            with probe.dump(model, out=sys.argv[2], level="mix"):
                with probe.mstx.range("epoch"):
                    losses = train_one_epoch(model, opt, 2)
        else:
            losses = train_one_epoch(model, opt, 2)
        print("losses", losses)
        """,
}


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    for name, text in USER_FILES.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return res


def _entries(run: Path, step: int) -> dict:
    return json.loads((run / f"step{step}" / "rank0" / "dump.json").read_text())["data"]


def test_probe_dump_and_profile_run_a_user_folder_with_the_rooms_names(user_folder):
    _run([str(PROBE), "dump", "--level", "module", "--out", "runs/d", "--", "main.py"], user_folder)
    names = set(_entries(user_folder / "runs" / "d", 0))
    assert {"Module.0.Linear.forward.0", "Module.2.Linear.backward.0"} <= names, sorted(names)
    _run([str(PROBE), "profile", "--out", "runs/p", "--", "main.py"], user_folder)
    trace = json.loads((user_folder / "runs" / "p" / "trace.json").read_text())
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("cat") == "step")
    assert steps == ["step 0", "step 1"], steps


def test_the_python_api_dumps_from_a_user_folder_with_the_rooms_names(user_folder):
    _run([sys.executable, "main.py", "--api", "runs/api"], user_folder)
    assert "Functional.linear.0.forward" in _entries(user_folder / "runs" / "api", 0)
    assert _entries(user_folder / "runs" / "api", 1)
