"""What runs inside a user's training process speaks through the ``probe`` logger, never
``print``: a host application must be able to route, format or silence it (STYLE.md)."""

from __future__ import annotations

import ast
import io
import logging
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The rooms whose code runs inside the user's process (hooks, sessions, the store, marks).
GUEST_ROOMS = ("ground", "collectors", "engine_adapter", "profiler", "compare", "checker",
               "visualizer", "dumper", "monitor/agent")


def _print_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_no_module_run_inside_the_users_process_prints():
    found = [f"{p.relative_to(ROOT)}:{line}"
             for room in GUEST_ROOMS if (ROOT / room).is_dir()
             for p in sorted((ROOT / room).rglob("*.py"))
             if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")) and p.name != "generate.py"
             for line in _print_calls(p)]
    assert not found, "print() where a logger belongs:\n" + "\n".join(found)


def test_a_host_silences_the_project_through_its_logger(tmp_path):
    """With the ``probe`` logger set to ERROR by the host, a dump's warning says nothing."""
    segment = tmp_path / "store" / "tensor" / "rank0" / "bad.parquet"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"not parquet")
    script = ("import logging, sys\n"
              "logging.getLogger('probe').setLevel(getattr(logging, sys.argv[1]))\n"
              "from probe.collectors.store import load_segments\n"
              f"load_segments({str(tmp_path)!r})\n")
    quiet, loud = (subprocess.run([sys.executable, "-c", script, level], capture_output=True,
                                  text=True, timeout=120) for level in ("ERROR", "WARNING"))
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert "not a readable Parquet segment" not in quiet.stderr
    assert "not a readable Parquet segment" in loud.stderr


def test_the_cli_prints_what_the_project_logs_as_written(tmp_path):
    from probe.ground.logs import print_to_stderr

    stream = io.StringIO()
    handler = print_to_stderr(stream)
    try:
        logging.getLogger("probe.dumper.recorder").warning("probe dump: error in x: E: y")
    finally:
        logging.getLogger("probe").removeHandler(handler)
    assert stream.getvalue() == "probe dump: error in x: E: y\n"
