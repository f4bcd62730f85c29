"""The monitor's three programs keep apart: the agent (inside every training rank) never imports
the service, the service never imports the agent, the detectors import neither, and what both
sides share (``monitor/*.py``) imports none of the three; lazy imports count too."""

from __future__ import annotations

from pathlib import Path

from tests.architecture import test_imports
from tests.architecture.test_imports import _imports

SIDES = ("agent", "service", "detectors")
#: Which subpackages each part of ``monitor/`` must never import.
FORBIDDEN = {"agent": {"service"}, "service": {"agent"}, "detectors": {"agent", "service"},
             "shared": set(SIDES)}


def _side(module: str) -> str | None:
    """``probe.monitor.agent.spool`` -> ``agent``; a module outside the three -> None."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["probe", "monitor"] and len(parts) > 2 and parts[2] in SIDES else None


def _wrong() -> list[str]:
    root = test_imports.ROOT / "monitor"
    wrong = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] == "proto":
            continue
        own = rel[0] if len(rel) > 1 else "shared"
        seen = set()
        for line, target in _imports(path):      # ``from m import n``: m, then m.n; m is enough
            side = _side(target)
            if side in FORBIDDEN[own] and line not in seen:
                seen.add(line)
                wrong.append(f"monitor/{'/'.join(rel)}:{line} imports {target} ({own} never imports {side})")
    return wrong


def test_agent_service_and_detectors_import_only_what_they_may():
    wrong = _wrong()
    assert not wrong, "imports across the monitor's sides:\n" + "\n".join(sorted(set(wrong)))


def test_the_check_sees_an_agent_importing_the_service(tmp_path, monkeypatch):
    for side in SIDES:
        (tmp_path / "monitor" / side).mkdir(parents=True)
    (tmp_path / "monitor" / "agent" / "x.py").write_text(
        "def f():\n    from probe.monitor.service.server import MonitorService\n")
    (tmp_path / "monitor" / "detectors" / "y.py").write_text("from probe.monitor.agent import spool\n")
    monkeypatch.setattr(test_imports, "ROOT", tmp_path)
    assert sorted(_wrong()) == [
        "monitor/agent/x.py:2 imports probe.monitor.service.server (agent never imports service)",
        "monitor/detectors/y.py:1 imports probe.monitor.agent (detectors never imports agent)"]
