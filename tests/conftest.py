"""Shared fixtures: the real msprobe dumps, and running the ``probe`` command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.msprobe_fixtures import MSPROBE_PY, msprobe_dumps

# A suite run as a background job (`bash scripts/test.sh &`, a script's `cmd &`) starts with
# SIGINT ignored, and every process it starts inherits that: the tests that stop a server or a
# launcher with Ctrl-C (probe web, the launcher, the README walk-through) then wait for a
# process that cannot hear it. Python's own handler again: its children get the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("PROBE_SHARED_DATA", ROOT.parent / "shared" / "data" / "msprobe"))


def msprobe_data_root() -> Path | None:
    """The folder of real msprobe dumps (``torch_L0``, ``torch_llama_mix``,
    ``torch_llama_md5_L1``, ``mindspore_L0``, ``mindspore_mix``): written by msprobe itself in
    ``.venv-bench`` on first use and cached (tests/msprobe_fixtures.py); when that Python has no
    msprobe, the copies in ../shared/data/msprobe (``PROBE_SHARED_DATA``); else None."""
    generated = msprobe_dumps()
    if generated is not None:
        return generated
    return SHARED_DATA if SHARED_DATA.is_dir() else None


@pytest.fixture(scope="session")
def msprobe_data() -> Path:
    """:func:`msprobe_data_root`; skips, saying how to get msprobe, when there is none."""
    root = msprobe_data_root()
    if root is None:
        pytest.skip(f"no msprobe to write the real msprobe dumps with ({MSPROBE_PY}: "
                    f"bash scripts/test.sh installs it) and none at {SHARED_DATA}")
    return root


def run_probe(*args: str, timeout: float = 300, env: dict | None = None,
              cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``probe ARGS`` as a user would, capturing its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "probe.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd)


@pytest.fixture
def logged(caplog):
    """What the project logged during the test (the ``probe`` logger's messages, one a line):
    messages from inside a user's process go through ``logging``, not stderr."""
    import logging

    caplog.set_level(logging.INFO, logger="probe")
    return lambda: "".join(r.getMessage() + "\n" for r in caplog.records if r.name.startswith("probe"))
