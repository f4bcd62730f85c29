"""The API precision check's failing calls, marked on a dump's graph.

``probe check-api DUMP`` writes ``check_api.parquet`` (and ``.csv``, ``summary.json``) into its
``--out`` folder, ``DUMP/check`` by default. :func:`find_check` finds that result for a dump
(given, or next to it); :class:`CheckMarks` keeps the calls graded ``nan``, ``error`` or
``warning`` at the graph's step and rank and says, per node, what to mark: a flagged call
(class ``check-<verdict>``, a ``✗ <verdict>`` badge before its label, its row in the detail
panel) and a node holding flagged calls (class ``check-in``, a ``✗N`` badge: how many; the
detail panel lists them, the worst first).
Reads only Parquet/CSV and JSON: no torch.

>>> m = CheckMarks([{"step": 0, "rank": 0, "name": "Functional.linear.3.forward", "verdict": "error",
...                  "reason": "beyond ...", "dtype": "torch.bfloat16"}])
>>> m.row("Functional.linear.3.forward")["verdict"], m.row("Torch.exp.0.forward")
('error', None)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from probe.collectors.msprobe_layout import step_rank
from probe.collectors.store import STORE_DIRNAME
from probe.ground.errors import ProbeError

#: what ``probe check-api`` writes (the Parquet table is read; the CSV when it is alone)
CHECK_FILES = ("check_api.parquet", "check_api.csv")
#: verdicts that mark a node, worst first
FLAGGED = ("nan", "error", "warning")
_RANK = {v: i for i, v in enumerate(FLAGGED)}


def table_of(folder: Path) -> Path | None:
    """The check table in ``folder`` (Parquet before CSV), or None."""
    for name in CHECK_FILES:
        if (folder / name).is_file():
            return folder / name
    return None


def find_check(dump: str | os.PathLike | None, given: str | os.PathLike | None = None,
               rank: int | None = None) -> Path | None:
    """The check table for a dump: in ``given`` (a ``probe check-api --out`` folder, its table,
    or an online check's ``check`` folder holding ``rank{R}/``), else next to the dump: its
    run folder's ``check/`` (``probe check-api``'s default ``--out``; ``check/rank{R}/`` of a
    ``probe dump --task check``) or the run folder itself. A ``given`` folder without a table is
    a :class:`ProbeError`; none next to the dump is None."""
    places: list[Path] = []
    if given is not None:
        g = Path(given)
        if g.is_file() and g.name in CHECK_FILES:
            return g
        places = [g] + ([g / f"rank{rank}"] if rank is not None else [])
    elif dump is not None:
        run = _run_folder(Path(dump))
        places = [run / "check"] + ([run / "check" / f"rank{rank}"] if rank is not None else []) + [run]
    for folder in places:
        found = table_of(folder)
        if found is not None:
            return found
    if given is not None:
        raise ProbeError(f"{given}: no check_api.parquet or check_api.csv; give a folder written by "
                         "probe check-api --out")
    return None


def _run_folder(p: Path) -> Path:
    """The run folder above a dump.json, its rank and step folders, or its record store."""
    p = p.resolve()
    if p.is_file():
        p = p.parent
    while p.parent != p and (step_rank(Path(p.name)) != (None, None) or p.name == STORE_DIRNAME):
        p = p.parent
    return p


def read_rows(table: Path) -> list[dict[str, Any]]:
    """The rows of a check table (Parquet or CSV)."""
    try:
        if table.suffix == ".parquet":
            import pyarrow.parquet as pq
            return pq.read_table(table).to_pylist()
        import pyarrow.csv as pcsv
        return pcsv.read_csv(table).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a file it cannot read
        raise ProbeError(f"{table}: not a readable check table ({type(e).__name__})") from None


class CheckMarks:
    """The flagged calls of a check (rows of ``check_api``), at one step and rank."""

    def __init__(self, rows: Iterable[Mapping[str, Any]], source: Path | None = None,
                 step: int | None = None, rank: int | None = None) -> None:
        self.source = source
        summary = source.parent / "summary.json" if source is not None else None
        self.summary: dict[str, Any] = {}
        if summary is not None and summary.is_file():
            try:
                self.summary = json.loads(summary.read_text())
            except (OSError, ValueError):
                self.summary = {}
        self.rows: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r.get("verdict") not in _RANK or not r.get("name"):
                continue
            if (step is not None and r.get("step") not in (None, step)) or \
                    (rank is not None and r.get("rank") not in (None, rank)):
                continue
            held = self.rows.get(r["name"])
            if held is None or _RANK[r["verdict"]] < _RANK[held["verdict"]]:
                self.rows[r["name"]] = {"golden": self.summary.get("golden"), **r}
        self._inside: dict[str, list[str]] | None = None

    @classmethod
    def for_graph(cls, graph: Any, given: str | os.PathLike | None = None) -> "CheckMarks | None":
        """The marks of the check found for ``graph`` (:func:`find_check` of its source), at
        the step and rank of its dump (``step{N}/rank{R}/dump.json``; a record store's graph
        names neither: every row marks); None when there is no check result."""
        source = getattr(graph, "source", None)
        step, rank = step_rank(Path(source)) if source is not None else (None, None)
        table = find_check(source, given, rank)
        if table is None:
            return None
        return cls(read_rows(table), table, step, rank)

    def row(self, name: str) -> dict[str, Any] | None:
        """The check row of a flagged call ``name`` (None: not flagged, or not checked)."""
        return self.rows.get(name)

    def inside(self, graph: Any, name: str) -> list[str]:
        """The flagged calls below ``name`` in ``graph``, worst first, then in execution order."""
        if self._inside is None:
            held: dict[str, list[str]] = {}
            for call in self.rows:
                if call in graph:
                    for a in graph.ancestors(call):
                        held.setdefault(a, []).append(call)
            for calls in held.values():
                calls.sort(key=lambda c: (_RANK[self.rows[c]["verdict"]], graph.nodes[c].order))
            self._inside = held
        return self._inside.get(name, [])

    def classes(self, graph: Any, name: str) -> str:
        """`` check-<verdict>`` for a flagged call, `` check-in`` for a node holding some."""
        own = self.rows.get(name)
        out = f" check-{own['verdict']}" if own else ""
        return out + (" check-in" if self.inside(graph, name) else "")

    def badge(self, graph: Any, name: str) -> str:
        """The text put before a node's label (first, so a narrow box still shows it): ``✗ error``
        on a flagged call, ``✗3`` on a node holding three (empty when neither).

        >>> CheckMarks([{"name": "Torch.matmul.1.forward", "verdict": "warning"}]).badge(None, "Torch.matmul.1.forward")
        '✗ warning '
        """
        own = self.rows.get(name)
        if own:
            return f"✗ {own['verdict']} "
        inside = self.inside(graph, name)
        return f"✗{len(inside)} " if inside else ""

    def label(self, graph: Any, name: str) -> str:
        """The node's label with its badge (:meth:`badge`)."""
        return self.badge(graph, name) + graph.nodes[name].label

    def __len__(self) -> int:
        return len(self.rows)
