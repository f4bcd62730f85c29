"""The agent's spool: records survive a torn write, and only this user's private files are used."""

import os
import stat
import tempfile

import pytest

from probe.monitor.agent.monitor_agent import MonitorAgent
from probe.monitor.agent.spool import Spool, default_spool_path, private_spool_dir
from probe.monitor.service.server import free_port


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The temp dir is tmp_path/tmp; no XDG_RUNTIME_DIR, no PROBE_MONITOR_SPOOL; a loose umask."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("PROBE_MONITOR_SPOOL", raising=False)
    old = os.umask(0)
    yield tmp_path
    os.umask(old)


def test_a_torn_spool_record_is_ignored(tmp_path):
    spool = Spool(tmp_path / "x.spool")
    spool.append(b"first")
    spool.append(b"second")
    with open(spool.path, "ab") as f:
        f.write(b"\x10\x00\x00\x00\x00")          # a header cut short by a crash
    assert list(spool.read()) == [b"first", b"second"]


def test_a_new_spool_file_is_readable_by_its_owner_only(private_tmp):
    spool = Spool(private_tmp / "s.spool")
    spool.append(b"batch")
    assert mode(spool.path) == 0o600


def test_the_default_spool_folder_is_private_to_the_user(private_tmp):
    warnings = []
    path = default_spool_path("my job", 2, warn=warnings.append)
    assert path.parent == private_tmp / "tmp" / f"probe-monitor-spool-{os.getuid()}"
    assert path.name == "my_job-rank2.spool"
    assert mode(path.parent) == 0o700 and warnings == []


def test_the_default_spool_folder_is_under_xdg_runtime_dir_when_set(private_tmp, monkeypatch):
    (private_tmp / "run").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private_tmp / "run"))
    folder = private_spool_dir(warn=pytest.fail)
    assert folder == private_tmp / "run" / "probe-monitor-spool" and mode(folder) == 0o700


def test_a_spool_folder_others_may_write_is_refused_for_the_next_private_one(private_tmp,
                                                                              monkeypatch):
    open_run = private_tmp / "run" / "probe-monitor-spool"
    open_run.mkdir(parents=True, mode=0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private_tmp / "run"))
    warnings = []
    folder = private_spool_dir(warn=warnings.append)
    assert folder == private_tmp / "tmp" / f"probe-monitor-spool-{os.getuid()}"
    assert mode(folder) == 0o700 and mode(open_run) == 0o777
    assert len(warnings) == 1 and "writable by others" in warnings[0]


def test_when_every_spool_folder_is_refused_a_fresh_private_one_is_made(private_tmp):
    shared = private_tmp / "tmp" / f"probe-monitor-spool-{os.getuid()}"
    shared.mkdir(mode=0o777)
    warnings = []
    folder = private_spool_dir(warn=warnings.append)
    assert folder != shared and folder.parent == private_tmp / "tmp" and mode(folder) == 0o700
    assert len(warnings) == 1 and "not resent" in warnings[0]


def test_a_link_planted_at_the_spool_path_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    planted = tmp_path / "r0.spool"
    planted.symlink_to(victim)
    dangling = tmp_path / "r1.spool"
    dangling.symlink_to(tmp_path / "created-by-the-agent")
    for link in (planted, dangling):
        spool = Spool(link)
        assert not spool.exists()
        with pytest.raises(OSError):
            spool.append(b"batch")
        with pytest.raises(OSError):
            list(spool.read())
    agent = MonitorAgent(f"127.0.0.1:{free_port()}", "j", 0, 1, spool_path=planted,
                         sample_host=False, exit_wait_s=0.3)
    agent.start()
    for step in range(5):
        agent.record(step, {"loss": 1.0})
    agent.close(timeout=8)                      # no service: the agent would spool, and cannot
    assert victim.read_bytes() == b"precious" and planted.is_symlink()
    assert not (tmp_path / "created-by-the-agent").exists()
    assert agent.dropped == 5                   # the points it could not keep are counted


def test_a_spool_file_of_another_user_is_neither_read_nor_appended_to(tmp_path, monkeypatch):
    spool = Spool(tmp_path / "s.spool")
    spool.append(b"batch")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(spool.path).st_uid + 1)
    foreign = Spool(tmp_path / "s.spool")
    assert not foreign.exists()
    with pytest.raises(OSError):
        foreign.append(b"more")
    with pytest.raises(OSError):
        list(foreign.read())
    foreign.remove()
    assert (tmp_path / "s.spool").read_bytes().endswith(b"batch")
