"""The shared-memory files a compare's reading child makes (``/dev/shm/probe-compare-<pid>-*.arrow``)
never outlive the compare (issue #33, finding 8): a child whose parent is gone removes its own,
and the files of compares killed outright (parent and child) are swept when the next compare
starts: only this user's, only of processes no longer alive."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from probe.compare import load
from tests.compare.dumps import chain, write_dump

pytestmark = pytest.mark.timeout(60)


def _folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _gone(pid: int) -> bool:
    """Process ``pid`` has exited (a zombie not yet reaped counts)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _files_of(pid: int) -> list[str]:
    return [n for n in os.listdir(_folder()) if n.startswith(f"{load._IPC_PREFIX}{pid}-")]


def test_files_of_dead_compares_are_swept_at_the_next_start_and_no_others(tmp_path):
    folder = _folder()
    dead = _dead_pid()
    left = [os.path.join(folder, f"{load._IPC_PREFIX}{dead}-x{i}.arrow") for i in range(2)]
    mine = os.path.join(folder, f"{load._IPC_PREFIX}{os.getpid()}-live.arrow")     # in use
    parent = os.path.join(folder, f"{load._IPC_PREFIX}{os.getppid()}-live.arrow")  # a live process's
    other = os.path.join(folder, f"{load._IPC_PREFIX}{dead}-x.notarrow")          # not ours by name
    try:
        for name in (*left, mine, parent, other):
            with open(name, "wb") as f:
                f.write(b"x" * 1024)
        data, construct = chain(2)
        a = write_dump(tmp_path / "a", data, construct)
        load.start_load(a, a).close()               # what every compare does as it starts
        assert not any(os.path.exists(n) for n in left)
        assert os.path.exists(mine) and os.path.exists(parent) and os.path.exists(other)
    finally:
        for name in (*left, mine, parent, other):
            if os.path.exists(name):
                os.unlink(name)


def test_a_child_whose_compare_was_killed_removes_its_files(tmp_path):
    """kill -9 of the compare while its child reads B: the child finishes, cannot hand its files
    over (the pipe's reader is gone) and removes them instead of leaving them in /dev/shm."""
    data, construct = chain(6)
    b = write_dump(tmp_path / "b", data, construct)
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from probe.compare import load
        real = load.load_dump
        def slow(path):                      # the child reads after its parent is gone
            time.sleep(1.0)
            return real(path)
        load.load_dump = slow
        pending = load.PendingDump({str(b)!r}, fork=True)
        print(pending._pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    child = int(p.stdout.split()[0])
    deadline = time.monotonic() + 20
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child), "the child did not finish"
    assert _files_of(child) == []


def test_files_handed_over_are_gone_once_read(tmp_path, monkeypatch):
    data, construct = chain(4)
    b = write_dump(tmp_path / "b", data, construct)
    pending = load.PendingDump(b, fork=True)
    child = pending._pid
    d = pending.result()
    assert d.tensors.num_rows and _files_of(child) == []
