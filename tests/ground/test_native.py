"""Native helpers built once per machine: cached by source, a compile error said and remembered,
a build past its time killed whole (no compiler left running) and tried again, one switch."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from probe.ground import native
from probe.ground.native import build_cached, load_cached

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler")


@needs_cc
def test_a_built_library_is_cached_and_a_changed_source_builds_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "one.c"
    src.write_text("int one(void) { return 1; }\n")
    first = build_cached(str(src), "one")
    assert first is not None and build_cached(str(src), "one") == first
    src.write_text("int one(void) { return 2 - 1; }\n")
    assert build_cached(str(src), "one") not in (None, first)


@needs_cc
def test_a_compile_error_is_said_once_with_how_to_retry_and_remembered(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "bad.c"
    src.write_text("this is not C\n")
    assert build_cached(str(src), "bad", what="the bad helper") is None
    markers = list((tmp_path / "cache" / "probe").glob("bad-*.failed"))
    assert len(markers) == 1
    said = [r.getMessage() for r in caplog.records if r.name == "probe.ground.native"]
    assert len(said) == 2 and "building the bad helper (bad.c)" in said[0]
    assert "failed" in said[1] and "error" in said[1] and str(markers[0]) in said[1]
    assert "python -m probe.native" in said[1]
    calls = []
    real_compile = native._compile
    monkeypatch.setattr(native, "_compile", lambda *a: (calls.append(a), real_compile(*a))[1])
    caplog.clear()
    assert build_cached(str(src), "bad") is None and calls == [] and not caplog.records
    markers[0].unlink()
    assert build_cached(str(src), "bad") is None and calls


def _fake_compiler(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cc = bin_dir / "cc"
    cc.write_text("#!/bin/sh\n" + script)
    cc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"     # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_build_past_its_time_is_killed_whole_and_not_remembered(tmp_path, monkeypatch, caplog):
    """The compiler driver (cc, g++) starts the compiler proper (cc1plus) as a child: killing
    the driver alone on time-out left an 870 MB cc1plus running. The whole group goes."""
    pid_file = tmp_path / "grandchild.pid"
    _fake_compiler(tmp_path, monkeypatch, f"sleep 300 &\necho $! > {pid_file}\nwait\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "BUILD_TIMEOUT_S", 1.0)
    src = tmp_path / "slow.c"
    src.write_text("int slow(void) { return 1; }\n")
    t0 = time.monotonic()
    assert build_cached(str(src), "slow", [["-a"], ["-b"]]) is None
    assert time.monotonic() - t0 < 30                      # one variant timed out: no second try
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert not list((tmp_path / "cache" / "probe").glob("*.failed"))
    said = [r.getMessage() for r in caplog.records if r.name == "probe.ground.native"]
    assert len(said) == 2 and "timed out after 1 s" in said[1] and "tried again" in said[1]


def test_probe_native_0_turns_every_helper_off(tmp_path, monkeypatch):
    _fake_compiler(tmp_path, monkeypatch, f"touch {tmp_path / 'ran'}\nexit 1\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "one.c"
    src.write_text("int one(void) { return 1; }\n")
    monkeypatch.setenv("PROBE_NATIVE", "0")
    assert not native.native_enabled()
    assert build_cached(str(src), "one") is None and load_cached(str(src), "one") is None
    assert not (tmp_path / "ran").exists()
    monkeypatch.setenv("PROBE_NATIVE", "1")
    assert native.native_enabled()


@needs_cc
def test_a_damaged_cached_library_is_built_again_not_loaded(tmp_path, monkeypatch):
    """A truncated shared library crashes the process that loads it (SIGBUS): the cache keeps
    each library's digest and builds again when the file is not the one it built."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "one.c"
    src.write_text("int one(void) { return 1; }\n")
    lib = build_cached(str(src), "one")
    whole = open(lib, "rb").read()
    with open(lib, "wb") as f:
        f.write(whole[:200])                # truncated by a full disk, a crash, a bad copy
    assert build_cached(str(src), "one") == lib and open(lib, "rb").read() == whole
    import ctypes
    assert ctypes.CDLL(lib).one() == 1
