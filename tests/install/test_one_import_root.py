"""Installing the project adds one top-level import name, ``probe``: the wheel holds nothing
else, and after installing it none of the rooms' old generic names is importable."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLD_NAMES = ("compare", "monitor", "web", "engine", "ground", "collectors", "checker",
             "simulator", "profiler", "visualizer", "engine_adapter", "dumper")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of the checkout (a build writes ``build/`` and
    ``*.egg-info`` beside the sources; the checkout stays as it is)."""
    import shutil

    source = tmp_path_factory.mktemp("source") / "project"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "runs", "test-output", "__pycache__",
        "*.so", ".pytest_cache"))
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "--disable-pip-version-check", "-q", "-w", str(out), str(source)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (found,) = out.glob("*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_name_and_every_room_under_it(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"probe"}, sorted(tops)
    for room in OLD_NAMES:
        assert f"probe/{room}/__init__.py" in names, room
    assert "probe/monitor/proto/monitor.proto" in names
    assert any(n.startswith("probe/profiler/_mstx_native") for n in names)


@pytest.mark.slow
def test_after_installing_the_wheel_the_old_names_are_not_importable(wheel, tmp_path):
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                          "--disable-pip-version-check", "--target", str(target), str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    check = ("import importlib.util, sys\n"
             f"sys.path.insert(0, {str(target)!r})\n"
             "import probe, probe.compare.api, probe.monitor.client, probe.dumper.session\n"
             f"assert probe.__file__.startswith({str(target)!r}), probe.__file__\n"
             f"print([n for n in {OLD_NAMES!r} if importlib.util.find_spec(n) is not None])\n")
    res = subprocess.run([sys.executable, "-c", check], cwd=neutral, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "[]"


def test_the_installed_project_adds_no_old_name_beside_probe(tmp_path):
    """The editable install the suite runs on maps ``probe.<room>`` only."""
    check = ("import importlib.util\n"
             f"print([n for n in {OLD_NAMES!r} if importlib.util.find_spec(n) is not None])\n"
             "import probe.compare, probe.web, probe.engine\n")
    res = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
