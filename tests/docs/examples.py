"""The examples a newcomer is shown, found where they are shown, and run as a newcomer would.

:func:`help_examples` reads every verb's ``--help`` (subcommands too), rendered wide so no line
is wrapped; :func:`readme_examples` reads the README's fenced shell blocks; :func:`readme_python`
its Python blocks. :class:`Workspace` runs command lines with ``bash -c`` in one folder holding a
copy of ``examples/``, the venv's ``probe`` first on PATH, substituting only what must be
(:func:`adapt`): every ``--preset`` is ``tiny`` and step counts small; servers listen on a free
port and are stopped once they say they listen; the monitor's ``127.0.0.1:50051`` is that port.
A line naming an address beyond loopback is not run (no test traffic leaves the machine) and
counts as failed: an example must run where it is read.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MONITOR_PORT = 50051          # the port the examples give the monitor
MAX_STEPS = 4                 # the most steps a foreground example trains
READY = re.compile(r"serving on (https?://\S+)|monitor listening on")
ELSEWHERE = re.compile(r"(?<![\d.])(?!127\.)\d{1,3}(\.\d{1,3}){3}(?![\d.])")


# ---------------------------------------------------------------- finding the examples

def help_pages() -> dict[str, str]:
    """Every ``--help`` page by command (``probe``, ``probe dump``, ``probe monitor trace``...),
    rendered 1000 columns wide so that no example is wrapped."""
    import click

    from probe.cli import cli

    pages: dict[str, str] = {}

    def walk(cmd: click.Command, name: str, parent: click.Context | None) -> None:
        ctx = click.Context(cmd, info_name=name.split()[-1], parent=parent,
                            terminal_width=1000, max_content_width=1000)
        pages[name] = cmd.get_help(ctx)
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, sub), f"{name} {sub}", ctx)

    walk(cli, "probe", None)
    return pages


def examples_in_help(text: str) -> list[str]:
    """The command lines of one help page: lines (or ``Example:`` lines) before its options that
    start with ``probe``, less a trailing ``(comment)``.

    >>> examples_in_help("Do it.\\n\\n  Example: probe x --a 1\\n\\n      probe y   (why)\\nOptions:\\n  probe z")
    ['probe x --a 1', 'probe y']
    """
    head = text.split("\nOptions:")[0]
    found = []
    for line in head.splitlines():
        m = re.match(r"\s*(?:Examples?:\s*)?(probe\s.*?)\s*(?:\s{2,}\(.*\))?\s*$", line)
        if m:
            found.append(m.group(1))
    return found


def help_examples() -> list[tuple[str, str]]:
    """``(page, command line)`` for every example of every ``--help`` page, in verb order."""
    return [(page, line) for page, text in help_pages().items() for line in examples_in_help(text)]


def _fenced(text: str, languages: tuple[str, ...]) -> list[str]:
    return [m.group(2) for m in re.finditer(r"(?ms)^```(\w*)\n(.*?)^```", text) if m.group(1) in languages]


def readme_examples() -> list[str]:
    """The ``probe`` command lines of the README's shell blocks, comments dropped; of a line
    that installs first (``... && probe demo``) the ``probe`` part."""
    found = []
    for block in _fenced(README.read_text(), ("", "sh", "bash", "console")):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            for part in line.split(" && "):
                if re.match(r"(\w+=\S+\s+)*probe\s", part.strip()):
                    found.append(part.strip())
    return found


def readme_python() -> list[str]:
    """The README's Python blocks."""
    return _fenced(README.read_text(), ("python",))


# ---------------------------------------------------------------- adapting and running one

@dataclass
class Step:
    """One command line as it will run: ``background`` for ``&`` jobs and servers,
    ``serves`` for a command that runs until stopped (stopped once it says it listens)."""
    line: str
    background: bool = False
    serves: bool = False
    expect_rc: int = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adapt(line: str, monitor_port: int) -> Step:
    """``line`` with only what must change for a test changed (see the module docstring).

    >>> adapt("probe train --preset 7b --max-steps 20 --out runs/t", 1).line
    'probe train --preset tiny --max-steps 4 --out runs/t'
    >>> adapt("probe dump --steps 0,2 --out runs/ref", 1).line
    'probe dump --steps 0,2 --out runs/ref --max-steps 3'
    >>> s = adapt("probe monitor serve --port 50051 &", 7)
    >>> s.line, s.background, s.serves
    ('probe monitor serve --port 7', True, True)
    >>> adapt("probe web --monitor 127.0.0.1:50051 --store runs/live", 7).line
    'probe web --monitor 127.0.0.1:7 --store runs/live --port 0'
    """
    background = line.endswith("&")
    line = line.rstrip("&").strip()
    line = line.replace(f"127.0.0.1:{MONITOR_PORT}", f"127.0.0.1:{monitor_port}")
    line = line.replace(f"--port {MONITOR_PORT}", f"--port {monitor_port}")
    line = re.sub(r"--preset\s+\S+", "--preset tiny", line)
    if not background:
        line = re.sub(r"--max-steps\s+(\d+)", lambda m: f"--max-steps {min(int(m.group(1)), MAX_STEPS)}", line)
    command = re.sub(r"^(\w+=\S+\s+)*", "", line)
    verb = command.split()[1] if len(command.split()) > 1 else ""
    engine = verb in ("train", "dump", "profile", "demo") and " -- " not in line
    if engine and "--max-steps" not in line:
        selected = [int(n) for n in re.findall(r"\d+", (re.findall(r"--steps\s+(\S+)", line) or [""])[0])]
        line += f" --max-steps {max(selected) + 1 if selected else 3 if verb != 'demo' else MAX_STEPS}"
    serves = (verb == "web" or (verb == "demo" and "--no-serve" not in line)
              or command.startswith("probe monitor serve"))
    if serves and "--port" not in line:
        line += " --port 0"
    return Step(line, background=background or serves, serves=serves)


@dataclass
class Ran:
    """What a step did: exit code (None while running), its output, the URL it served."""
    step: Step
    proc: subprocess.Popen | None = None
    out: list[str] = field(default_factory=list)
    rc: int | None = None
    url: str | None = None
    seconds: float = 0.0
    stopped: bool = False           # stopped by the test (a server, a background job)

    def text(self) -> str:
        return "".join(self.out)

    def problem(self) -> str | None:
        """Why this step failed, in words, or None."""
        if "Traceback (most recent call last)" in self.text():
            return "printed a traceback"
        if self.step.serves and self.url is None and not self.ready:
            return "never said it listens"
        if self.rc is not None and self.rc != self.step.expect_rc and not self.stopped:
            return f"exit code {self.rc}"
        return None

    @property
    def ready(self) -> bool:
        return any(READY.search(line) for line in self.out)


class Workspace:
    """One folder a newcomer works in: ``examples/`` copied in, ``probe`` from this venv first
    on PATH. :meth:`run` runs a step; background steps run until :meth:`close`."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None) -> None:
        self.folder = folder
        shutil.copytree(ROOT / "examples", folder / "examples", dirs_exist_ok=True)
        self.monitor_port = free_port()
        self.env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                        PYTHONUNBUFFERED="1", PROBE_MONITOR=f"127.0.0.1:{self.monitor_port}", **(env or {}))
        self.env.pop("PROBE_DEBUG", None)
        self.ran: list[Ran] = []
        self.seen: set[str] = set()

    def run(self, line: str, timeout: float = 300, expect_rc: int = 0) -> Ran | None:
        """Run one example line (adapted); None when the same adapted line already ran here."""
        step = adapt(line, self.monitor_port)
        step.expect_rc = expect_rc
        if step.line in self.seen:
            return None
        self.seen.add(step.line)
        ran = Ran(step)
        self.ran.append(ran)
        if ELSEWHERE.search(step.line):          # never sends a test's traffic off this machine
            ran.rc = -1
            ran.out.append("[test: not run: it names an address beyond loopback; an example must "
                           "run where it is read]\n")
            return ran
        t0 = time.monotonic()
        ran.proc = subprocess.Popen(["bash", "-c", step.line],
                                    cwd=self.folder, env=self.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
        reader = threading.Thread(target=lambda: ran.out.extend(iter(ran.proc.stdout.readline, "")), daemon=True)
        reader.start()
        if step.background:
            self._wait_ready(ran, timeout)
            if step.serves and not step.line.startswith("probe monitor serve"):
                self._stop(ran)             # a dashboard: seen to answer, then stopped
        else:
            try:
                ran.rc = ran.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._stop(ran)
                ran.stopped, ran.rc = False, -1
                ran.out.append(f"\n[test: stopped after {timeout:.0f} s]\n")
            reader.join(timeout=10)
        ran.seconds = time.monotonic() - t0
        return ran

    def _wait_ready(self, ran: Ran, timeout: float) -> None:
        """Until the job says it listens (a server) or the monitor has its first step (a
        training job streaming to it: its step table shows only when it ends)."""
        end = time.monotonic() + timeout
        out = re.search(r"--out\s+(\S+)", ran.step.line)
        while time.monotonic() < end and ran.proc.poll() is None:
            if not ran.step.serves and out and self._monitor_has(Path(out.group(1)).name):
                ran.out.append("[test: the monitor has its steps]\n")
                return
            for line in list(ran.out):
                m = READY.search(line)
                if m:
                    ran.url = m.group(1)
                    if ran.url:
                        with urllib.request.urlopen(ran.url, timeout=60) as r:
                            ran.out.append(f"[test: GET {ran.url.split('?')[0]} -> {r.status}]\n")
                    return
            time.sleep(0.2)
        if ran.proc.poll() is not None:
            ran.rc = ran.proc.returncode
            ran.out.append(f"\n[test: exited with {ran.rc} before it was ready]\n")

    def _monitor_has(self, job: str) -> bool:
        from probe.ground.errors import ProbeError
        from probe.monitor.client import MonitorClient

        try:
            with MonitorClient(f"127.0.0.1:{self.monitor_port}") as client:
                jobs = client.status(job=job)["jobs"]
        except ProbeError:
            return False
        return any(j["job"] == job and j["last_step"] is not None and j["last_step"] >= 0 for j in jobs)

    def _stop(self, ran: Ran) -> None:
        if ran.proc.poll() is None:
            ran.stopped = True
            try:
                os.killpg(ran.proc.pid, signal.SIGINT)
                ran.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(ran.proc.pid, signal.SIGKILL)
                ran.proc.wait(timeout=30)

    def stop_jobs(self) -> None:
        """Stop the background jobs that are not servers (a user's Ctrl-C once done with them)."""
        for ran in self.ran:
            if ran.proc is not None and ran.step.background and not ran.step.serves:
                self._stop(ran)

    def close(self) -> None:
        """Stop what still runs in the background (a user's Ctrl-C), last started first."""
        for ran in reversed(self.ran):
            if ran.proc is not None:
                self._stop(ran)

    def timings(self) -> str:
        """Seconds each line took, slowest first (``pytest -s`` prints them at the end)."""
        return "\n".join(f"{r.seconds:6.1f} s  {r.step.line}" for r in sorted(self.ran, key=lambda r: -r.seconds))

    def failures(self) -> list[str]:
        return [f"{r.step.line}\n  -> {r.problem()} after {r.seconds:.0f} s; output ends:\n"
                + "\n".join("     " + x for x in r.text().strip().splitlines()[-15:])
                for r in self.ran if r.problem()]
