"""A disk that fills while ``probe dump`` writes ends the command with one line naming the folder
and "no space left on device" (exit 2), not "no step was dumped" (exit 1) nor a traceback; the
steps written before stay whole (msprobe files and store records alike), nothing of the step
that did not fit is left, and the training is not harmed (issue #33, finding 11)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from probe.cli import main

pytestmark = pytest.mark.timeout(300)

#: the msprobe files of step 1 do not fit: every write of one raises ENOSPC, as a full disk does
FILL_STEP1 = textwrap.dedent("""
    import builtins, errno, os
    from probe.collectors import msprobe_writer

    class _Full:
        def __init__(self, f):
            self.f = f
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self.f.close()

    def _open(path, *args, **kwargs):
        f = builtins.open(path, *args, **kwargs)
        return _Full(f) if os.sep + "step1" + os.sep in str(path) else f

    msprobe_writer.open = _open
""")


def _check(out, rc: int, err: str) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, err
    assert "Traceback" not in err and "no step was dumped" not in err, err
    assert lines[-1].startswith("probe: error: ") and "no space left on device" in lines[-1], err
    assert str(out) in lines[-1], err
    assert sum("no space left" in x for x in lines) == 1, err
    # step 0 is whole: its three files, readable, and its records in the store; nothing of step 1
    from probe.collectors.msprobe_reader import read_msprobe_dump
    from probe.collectors.store import open_store

    assert sorted(os.listdir(out / "step0" / "rank0")) == ["construct.json", "dump.json", "stack.json"]
    assert read_msprobe_dump(out / "step0" / "rank0").tensors.num_rows > 0
    assert not (out / "step1").exists()
    assert [f for _, _, files in os.walk(out) for f in files if f.endswith(".tmp") or f.startswith(".tmp")] == []
    steps = open_store(str(out)).sql("select distinct step from tensors order by step").fetchall()
    assert steps == [(0,)]


def test_a_full_disk_during_probe_dump_is_one_line_exit_2_in_process(tmp_path, capsys, monkeypatch):
    from probe.collectors import msprobe_writer
    # (set first, so that the undo after the test takes away what the exec below puts there:
    # set after it, the undo restored the failing open and every later dump's step 1 was full)
    monkeypatch.setattr(msprobe_writer, "open", open, raising=False)
    exec(FILL_STEP1, {})                 # patches probe.collectors.msprobe_writer.open
    out = tmp_path / "d"
    rc = main(["dump", "--preset", "tiny", "--level", "module", "--steps", "0-1", "--out", str(out)])
    _check(out, rc, capsys.readouterr().err)


def test_a_full_disk_during_probe_dump_is_one_line_exit_2_in_a_real_process(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FILL_STEP1)
    out = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "probe.cli", "dump", "--preset", "tiny", "--level", "module",
                        "--steps", "0-1", "--out", str(out)], capture_output=True, text=True, env=env, timeout=240)
    _check(out, p.returncode, p.stderr)


def test_the_python_api_raises_the_full_disk_at_stop_and_training_goes_on(tmp_path, monkeypatch):
    import torch

    import probe
    from probe.collectors import msprobe_writer
    from probe.ground.files import DiskFull

    monkeypatch.setattr(msprobe_writer, "open", open, raising=False)    # undone after the test
    exec(FILL_STEP1, {})
    net = torch.nn.Sequential(torch.nn.Linear(4, 2))
    s = probe.start(net, out=str(tmp_path / "api"), auto_step=False)
    for _ in range(3):                       # step 1 does not fit, step 2 is not written either
        net(torch.ones(1, 4)).sum().backward()
        probe.step()
    with pytest.raises(DiskFull, match="no space left on device"):
        probe.stop()
    probe.stop()                             # said once
    assert s.steps_written == [0] and s.disk_full is not None
    assert errno.ENOSPC


@pytest.fixture
def small_disk(tmp_path):
    """A 300 KB tmpfs (this test runs as root), else a skip."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_really_full_disk_keeps_every_step_before_it_whole(small_disk):
    """On a 300 KB disk a few steps fit: the command ends with the one line, every step folder
    left holds its three files and its records in the store, and no other."""
    from probe.collectors.store import open_store

    out = small_disk / "d"
    p = subprocess.run([sys.executable, "-m", "probe.cli", "dump", "--preset", "tiny", "--level", "module",
                        "--steps", "0-7", "--out", str(out)], capture_output=True, text=True, timeout=240)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert lines[-1].startswith("probe: error: ") and "no space left on device" in lines[-1], p.stderr
    folders = sorted(int(d.name[4:]) for d in out.glob("step*"))
    assert folders and folders == list(range(len(folders))) and len(folders) < 8, folders
    for n in folders:
        assert sorted(os.listdir(out / f"step{n}" / "rank0")) == ["construct.json", "dump.json", "stack.json"]
    stored = [s for (s,) in open_store(str(out)).sql("select distinct step from tensors order by step").fetchall()]
    assert stored == folders
    assert [f for _, _, files in os.walk(out) for f in files if f.endswith(".tmp") or f.startswith(".tmp")] == []


@pytest.mark.slow
def test_a_full_disk_on_two_ranks_ends_the_command_with_exit_2(tmp_path):
    """Each rank says which folder is full; the command ends with the ranks' code, 2 (it was 1:
    the launcher turned every rank's exit into 1)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FILL_STEP1)
    out = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "probe.cli", "dump", "--preset", "tiny", "--level", "module",
                        "--nproc", "2", "--steps", "0-1", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=280)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "no space left on device" in p.stderr, p.stderr
    assert str(out) in p.stderr
    for rank in (0, 1):
        assert sorted(os.listdir(out / "step0" / f"rank{rank}")) == ["construct.json", "dump.json", "stack.json"]
