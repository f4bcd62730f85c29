"""Native helpers built once per machine: cached by source, and a failed slow build not retried."""

from __future__ import annotations

import shutil

import pytest

from probe.ground.native import build_cached

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
def test_a_failed_build_is_remembered_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = tmp_path / "bad.c"
    src.write_text("this is not C\n")
    assert build_cached(str(src), "bad", remember_failure=True) is None
    markers = list((tmp_path / "cache" / "probe").glob("bad-*.failed"))
    assert len(markers) == 1
    calls = []
    real_run = __import__("subprocess").run
    monkeypatch.setattr("subprocess.run", lambda *a, **k: (calls.append(a), real_run(*a, **k))[1])
    assert build_cached(str(src), "bad", remember_failure=True) is None and calls == []
    assert build_cached(str(src), "bad") is None and calls        # not asked: tried again
    markers[0].unlink()
    calls.clear()
    assert build_cached(str(src), "bad", remember_failure=True) is None and calls


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
