"""Fixtures for the monitor: a service in this process, or ``probe monitor serve`` as a subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from probe.monitor.service.server import MonitorService, free_port

ROOT = Path(__file__).resolve().parents[2]


class ServeProcess:
    """``probe monitor serve`` running in the foreground of a child process."""

    def __init__(self, store: Path, port: int = 0, *extra: str) -> None:
        self.store, self.extra = store, extra
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServeProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PROBE_MONITOR_TOKEN", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "probe.cli", "monitor", "serve", "--port", str(self.port),
             "--store", str(self.store), *self.extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+):(\d+)", line)
        if not m:
            raise RuntimeError(f"serve did not start: {line!r}")
        self.port = int(m.group(2))
        self.log: list[str] = [line]
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        """Keep reading the service's log so a full pipe never blocks it."""
        for line in self.proc.stdout:
            self.log.append(line)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture
def serve(tmp_path):
    """Start ``probe monitor serve`` on a free port with a store in tmp_path; killed afterwards."""
    started: list[ServeProcess] = []

    def start(*extra: str, port: int = 0, store: Path | None = None) -> ServeProcess:
        proc = ServeProcess(store or tmp_path / "monitor.duckdb", port, *extra).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def service(tmp_path):
    """A MonitorService in this process on a free port (fast; for protocol-level tests)."""
    svc = MonitorService(tmp_path / "monitor.duckdb", port=0, detect_interval_s=0.05)
    svc.start()
    yield svc
    svc.stop(grace=0)


def wait_for(predicate, timeout: float = 30.0, poll: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
