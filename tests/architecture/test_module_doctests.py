"""Every module's own examples run as written: the ``>>>`` lines of the docstrings of every
module of the product (docs/ARCHITECTURE.md asks a new detector, reader or writer for one).

Each module's examples run in an empty folder, so an example that writes ``runs/...`` writes
nothing into the checkout. Modules of an optional engine run where it is installed.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ground", "collectors", "engine_adapter", "profiler", "compare", "checker",
            "visualizer", "dumper", "monitor", "engine", "simulator", "web", "probe")


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or ">>>" not in path.read_text():
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts if parts[0] == "probe" else ("probe", *parts)))
    return found


MODULES = _modules()


def test_the_product_has_examples_in_its_modules():
    assert len(MODULES) >= 60


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run_as_written(name, tmp_path, monkeypatch):
    if ".mindspore_" in name and importlib.util.find_spec("mindspore") is None:
        pytest.skip("mindspore is not installed")
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    out: list[str] = []
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)[-4000:]
