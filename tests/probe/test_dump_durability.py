"""``--fsync step`` forces each finished step's msprobe and tensor files to disk; a ``kill -9``
of ``probe dump -- script.py`` leaves every finished step complete and comparable."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from probe.compare.api import compare
from probe.cli import main as probe_main
from probe.dumper.session import DumpSession
from probe.dumper.writer import STEP_FILES
from tests.conftest import ROOT, run_probe

SCRIPT = textwrap.dedent("""
    import sys, torch
    from torch import nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for step in range(int(sys.argv[1])):
        net(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
""")


@pytest.fixture
def synced(monkeypatch) -> list[str]:
    """The paths os.fsync is called on, in order."""
    paths: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", record)
    return paths


def _tensor_files(folder: Path) -> list[str]:
    dump = json.loads((folder / "dump.json").read_text())
    found: list[str] = []

    def walk(v: object) -> None:
        if isinstance(v, dict):
            if "data_name" in v:
                found.append(str(folder / "dump_tensor_data" / v["data_name"]))
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(dump["data"])
    return found


def _train(out: Path, fsync: str) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    with DumpSession(net, out=out, task="tensor", store=False, auto_step=False, fsync=fsync) as s:
        for _ in range(2):
            net(torch.ones(2, 3)).sum().backward()
            s.step()


def test_fsync_step_forces_each_steps_files_and_folders_tensor_files_first(tmp_path, synced):
    out = (tmp_path / "d").resolve()
    _train(out, "step")
    for step in (0, 1):
        folder = out / f"step{step}" / "rank0"
        tensors = _tensor_files(folder)
        assert tensors
        wanted = [*tensors, *(str(folder / n) for n in STEP_FILES),
                  str(folder / "dump_tensor_data"), str(folder), str(folder.parent), str(out)]
        assert set(wanted) <= set(synced), set(wanted) - set(synced)
        dump_json = synced.index(str(folder / "dump.json"))
        assert max(synced.index(t) for t in tensors) < dump_json  # on disk before it is named


def test_fsync_never_leaves_the_disk_to_the_os(tmp_path, synced):
    _train(tmp_path / "d", "never")
    assert (tmp_path / "d" / "step1" / "rank0" / "stack.json").exists() and synced == []


@pytest.mark.parametrize("fsync", ["step", "never"])
def test_probe_dump_of_a_script_passes_fsync_to_the_writer_and_the_store(tmp_path, synced, fsync):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = (tmp_path / "d").resolve()
    assert probe_main(["dump", "--task", "tensor", "--fsync", fsync, "--out", str(out),
                       "--", str(script), "2"]) == 0
    step1 = out / "step1" / "rank0"
    assert (step1 / "stack.json").exists()
    if fsync == "never":
        assert synced == []
    else:
        assert str(step1 / "dump.json") in synced and set(_tensor_files(step1)) <= set(synced)
        assert any("/store/tensor/" in p for p in synced)          # the store's segments too


@pytest.mark.slow
def test_kill_9_after_step_1_leaves_steps_0_and_1_complete_and_comparable(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    ref = tmp_path / "ref"
    r = run_probe("dump", "--task", "tensor", "--steps", "0-1", "--out", str(ref), "--",
                  str(script), "2")
    assert r.returncode == 0, r.stderr
    rng = random.Random(20261125)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for attempt in range(3):
        run = tmp_path / f"run{attempt}"
        child = subprocess.Popen([sys.executable, "-m", "probe.cli", "dump", "--task", "tensor",
                                  "--out", str(run), "--", str(script), "1000000"], cwd=ROOT,
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not (run / "step1" / "rank0" / "stack.json").exists():   # written last
                assert child.poll() is None and time.monotonic() < deadline, "step 1 never finished"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
        for step in (0, 1):
            a, b = run / f"step{step}" / "rank0", ref / f"step{step}" / "rank0"
            for name in STEP_FILES:
                json.loads((a / name).read_text())
            result = compare(str(a), str(b), out=tmp_path / f"cmp{attempt}-{step}")
            rows = result.rows.to_pylist()
            assert len(rows) == len(_tensor_files(a)) > 0, f"attempt {attempt} step {step}"
            assert all(row["verdict"] == "pass" and row["cosine"] == pytest.approx(1.0)
                       for row in rows), f"attempt {attempt} step {step}"
    r = run_probe("compare", str(run / "step1" / "rank0"), str(ref / "step1" / "rank0"),
                  "--out", str(tmp_path / "cli"), "--fail-on", "warning")
    assert r.returncode == 0, r.stderr
    assert pq.read_table(tmp_path / "cli" / "compare.parquet").num_rows == len(rows)
