"""Inputs the fuzz tests mutate: a small dump of our own (with its store) and msprobe's real
dumps, each cut to its first entries so that a case compares in a fraction of a second."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from probe.collectors.msprobe_layout import loads
from tests.conftest import msprobe_data_root, run_probe

#: Entries kept of each dump (its construct.json and stack.json are kept whole).
KEEP_ENTRIES = 20


@pytest.fixture(scope="session")
def our_run(tmp_path_factory) -> Path:
    """``probe dump --preset tiny --max-steps 1 --level mix``: dump folders and the store."""
    out = tmp_path_factory.mktemp("fuzz") / "ours"
    p = run_probe("dump", "--preset", "tiny", "--max-steps", "1", "--level", "mix", "--out", str(out))
    assert p.returncode == 0, p.stderr
    return out


def _cut(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    doc = loads((src / "dump.json").read_bytes())
    doc["data"] = dict(list(doc["data"].items())[:KEEP_ENTRIES])
    (dst / "dump.json").write_text(json.dumps(doc, indent=1))
    for name in ("construct.json", "stack.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


@pytest.fixture(scope="session")
def fuzz_sources(our_run, tmp_path_factory) -> dict[str, Path]:
    """Folders holding a cut dump.json with its construct.json and stack.json, by name: ours,
    and each of msprobe's real dumps (tests/msprobe_fixtures.py) when there are some."""
    root = tmp_path_factory.mktemp("fuzz-sources")
    sources = {"ours": _cut(our_run / "step0" / "rank0", root / "ours")}
    real = msprobe_data_root()
    if real is not None:
        for dump in sorted(real.glob("*/step*/*/dump.json")):
            name = dump.parent.parent.parent.name
            sources[name] = _cut(dump.parent, root / name)
    return sources
