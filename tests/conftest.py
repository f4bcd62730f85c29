"""Shared fixtures: where the real msprobe dumps are, and running the ``probe`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("PROBE_SHARED_DATA", ROOT.parent / "shared" / "data" / "msprobe"))


@pytest.fixture(scope="session")
def msprobe_data() -> Path:
    """The folder of real msprobe dumps (../shared/data/msprobe); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real msprobe dumps not found at {SHARED_DATA}")
    return SHARED_DATA


def run_probe(*args: str, timeout: float = 300, env: dict | None = None,
              cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``probe ARGS`` as a user would, capturing its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "probe.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd)
