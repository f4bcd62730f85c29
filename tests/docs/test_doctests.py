"""The Python examples of the docs pages run as written: every ``>>>`` of docs/*.md, each page
by ``python -m doctest`` in its own process and an empty folder (a page's examples build on
each other; pages do not share state)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md") if ">>> " in p.read_text())


def test_every_job_has_a_page_with_python_examples():
    assert {p.stem for p in PAGES} >= {"dump", "compare", "monitor", "web"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_examples_run_as_written(page, tmp_path):
    p = subprocess.run([sys.executable, "-m", "doctest", "-o", "ELLIPSIS", "-o", "NORMALIZE_WHITESPACE",
                        str(page)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
