"""The house in order: no import cycle (between packages or files) and no import against the flow.

The packages stand on floors, lowest first (``docs/ARCHITECTURE.md`` draws them). A module may
import a package on a lower floor or its own package, never a higher floor or a package on the
same floor. Imports inside functions count as much as those at the top: a lazy import is still
a dependency. Generated gRPC stubs are left out.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The floors, lowest first; each package imports only packages on lower floors.
FLOORS: list[tuple[str, ...]] = [
    ("ground",),            # errors and exit codes, native-helper cache, selections, background queue
    ("collectors",),        # record schemas, the store, format readers and writers
    ("engine_adapter",),    # attaching to PyTorch / MindSpore; the training-callback interface
    ("profiler",),          # mstx, profiling sessions, FLOPs
    ("compare",),           # loading, matching, metrics, verdicts of two dumps
    ("checker",),           # API precision check: replay recorded calls on a golden, grade them (torch)
    ("visualizer",),        # hierarchy graph and diff model for the UI
    ("dumper",),            # the dump engine: recorder, rows, writer, sessions (probe.dump/start/step/stop)
    ("monitor",),           # the gRPC service and the per-rank agent that speaks its protocol
    ("engine",),            # the bundled engine: models, training loop, launcher, faults
    ("simulator",),         # simulated training steps: fake tensors, memory, time, layouts
    ("web",),               # the Dash app
    ("probe",),             # the public API (lazy names) and the command line: nothing imports it
]
FLOOR = {pkg: i for i, floor in enumerate(FLOORS) for pkg in floor}
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def _module_name(path: Path) -> str:
    """The import name of a source file: every room installs under ``probe.<room>``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] != "probe":
        parts.insert(0, "probe")
    return ".".join(parts)


def _room(module: str) -> str | None:
    """The room (floor key) an import name belongs to: ``probe.compare.api`` -> ``compare``,
    ``probe.cli`` -> ``probe``; ``None`` outside the project."""
    parts = module.split(".")
    if parts[0] != "probe":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FLOOR and parts[1] != "probe" else "probe"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # ``from pkg import submodule`` names a module too
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def _sources() -> list[Path]:
    files = []
    for pkg in FLOOR:
        files += [p for p in (ROOT / pkg).rglob("*.py") if not p.name.endswith(GENERATED)]
    return sorted(files)


def _file_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for _, target in _imports(path):
            if target in modules and target != name and not modules[target].name == "__init__.py":
                graph[name].add(target)
    return graph


def test_every_package_is_on_a_floor():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages <= set(FLOOR), f"packages with no floor in FLOORS: {sorted(packages - set(FLOOR))}"


def test_no_import_runs_against_the_floors():
    wrong = []
    for path in _sources():
        own = path.relative_to(ROOT).parts[0]
        for line, target in _imports(path):
            top = _room(target)
            if top is not None and top != own and FLOOR[top] >= FLOOR[own]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} "
                             f"({own} is on floor {FLOOR[own]}, {top} on floor {FLOOR[top]})")
    assert not wrong, "imports against the documented order:\n" + "\n".join(sorted(set(wrong)))


def test_no_two_files_import_each_other_in_a_circle():
    graph = _file_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles between files:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_check_sees_a_planted_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks are not vacuous: a planted upward import and a planted cycle are found."""
    global ROOT
    for pkg in FLOOR:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "collectors" / "a.py").write_text("from probe.collectors import b\nimport probe.cli\n")
    (tmp_path / "collectors" / "b.py").write_text("from .a import x\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    try:
        test_no_import_runs_against_the_floors()
    except AssertionError as e:
        assert "collectors/a.py:2 imports probe.cli" in str(e)
    else:
        raise AssertionError("the upward import collectors -> probe was not found")
    try:
        test_no_two_files_import_each_other_in_a_circle()
    except AssertionError as e:
        assert "probe.collectors.a -> probe.collectors.b -> probe.collectors.a" in str(e)
    else:
        raise AssertionError("the cycle collectors.a <-> collectors.b was not found")


def test_the_architecture_page_draws_the_floors_the_test_holds():
    import re

    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    drawn = [m.group(2) for m in re.finditer(r"^ floor (\d+)\s+(\w+)/", page, re.M)]
    assert drawn[::-1] == [room for floor in FLOORS for room in floor], drawn
