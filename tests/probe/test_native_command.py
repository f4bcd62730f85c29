"""``python -m probe.native``: every native helper built ahead of its first use, failed builds
tried again, one line per helper, an exit status a CI step can test."""

from __future__ import annotations

from probe import native as command
from probe.ground import native


def test_it_retries_failed_builds_and_says_which_helper_fell_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("PROBE_NATIVE", raising=False)
    marker = tmp_path / "probe" / "x-0123.failed"
    marker.parent.mkdir()
    marker.write_text("building x failed\n")
    helpers = [("built one", "a.c", lambda: object()), ("failed one", "b.cpp", lambda: False)]
    monkeypatch.setattr(command, "_helpers", lambda: helpers)
    monkeypatch.setattr(native, "BUILD_TIMEOUT_S", native.BUILD_TIMEOUT_S)     # restored after
    assert command.main(["--timeout", "5"]) == 1 and native.BUILD_TIMEOUT_S == 5
    out, err = capsys.readouterr()
    assert not marker.exists() and str(marker) in err
    lines = out.splitlines()
    assert lines[0].split()[-1] == "native" and lines[1].endswith("Python twin")
    helpers.pop()
    assert command.main([]) == 0


def test_with_probe_native_0_nothing_is_built(monkeypatch):
    monkeypatch.setenv("PROBE_NATIVE", "0")
    monkeypatch.setattr(command, "_helpers", lambda: 1 / 0)
    assert command.main([]) == 2
