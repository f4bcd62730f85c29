"""The dumps a dashboard may open, and the diffs it has opened.

The dashboard is started on some dumps (and maybe a compare result); the folders holding them
are its *roots*. From the page one may open any *run* under a root (a folder holding msprobe
dumps, ``step<N>/rank<R>/dump.json``, or a record store, ``store/``) against another, at any step
and rank both hold, with or without a *compare result* (a ``probe compare --out`` folder). A
choice outside the roots, a folder that holds no dump, a step or rank a run lacks, a compare
result of other dumps: each is a :class:`probe.ground.errors.ProbeError` whose one line says what to
choose instead (the page shows it).

An opened choice keeps its diff graph and the two side views (:class:`Opened`); the last few
are kept, the one the dashboard started on always. Each side's view marks the calls that the API
precision check of its dump flagged (:mod:`probe.visualizer.check_marks`): the result given for that
run (``probe web --check``), else one found next to the dump (``RUN/check/``).

>>> cat = Catalog(["/runs"])                                             # doctest: +SKIP
>>> cat.runs()                                                           # doctest: +SKIP
['/runs/fused', '/runs/ref']
>>> cat.open(Choice("/runs/ref", "/runs/fused", step=0, rank=1)).diff.paired  # doctest: +SKIP
True
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from probe.collectors.msprobe_layout import find_dump_files, step_rank
from probe.collectors.store import STORE_DIRNAME
from probe.ground.errors import ProbeError
from probe.ground.files import read_regular
from probe.visualizer.check_marks import CheckMarks
from probe.visualizer.diff import SIDES, DiffGraph
from probe.visualizer.view import SideView

#: the largest compare summary.json read
MAX_SUMMARY_BYTES = 64 << 20
#: What a compare result folder holds.
COMPARE_FILES = ("summary.json", "nodes.parquet", "compare.parquet")
_STEP_DIRS = ("step*/*/dump.json", "*/dump.json", "dump.json")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    """What to open: dump ``a`` (and ``b``), a ``compare`` result, the ``step`` and ``rank``."""

    a: str | None = None
    b: str | None = None
    compare: str | None = None
    step: int | None = None
    rank: int | None = None

    def params(self) -> dict[str, str]:
        """The choice as text fields (the ones set), e.g. for a URL's query."""
        return {k: str(v) for k, v in asdict(self).items() if v not in (None, "")}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "Choice":
        """The choice of text fields (:meth:`params`); a step or rank that is no number is an
        error naming it."""
        out: dict[str, Any] = {}
        for k in ("a", "b", "compare"):
            v = params.get(k)
            out[k] = (str(v).strip() or None) if v is not None else None
        for k in ("step", "rank"):
            v = params.get(k)
            if v in (None, ""):
                out[k] = None
                continue
            try:
                out[k] = int(str(v).strip())
            except ValueError:
                raise ProbeError(f"{k} {v!r} is not a number; choose one the dump holds") from None
        return cls(**out)

    @property
    def key(self) -> str:
        """A short stable name of the choice."""
        return hashlib.sha1(repr(sorted(self.params().items())).encode()).hexdigest()[:12]


@dataclass
class Opened:
    """An opened choice: its diff graph and the view of each side."""

    choice: Choice
    diff: DiffGraph
    views: dict[str, SideView] = field(default_factory=dict)
    #: per side, the API precision check result given for its dump (else one next to it is
    #: looked for: :func:`probe.visualizer.check_marks.find_check`)
    checks: Mapping[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.diff.refusal:
            for side in SIDES if self.diff.paired else ("a",):
                marks = CheckMarks.for_graph(self.diff.graph(side), self.checks.get(side))
                self.views[side] = SideView(self.diff, side, marks)


def run_folder(path: str | os.PathLike) -> Path:
    """The run folder that ``path`` names: itself, or the folder above its dump.json, rank,
    step or store folders."""
    p = Path(path).resolve()
    if p.is_file():
        p = p.parent
    while p.parent != p and (step_rank(Path(p.name)) != (None, None) or p.name == STORE_DIRNAME):
        p = p.parent
    return p


def _summary_dumps(path: Path) -> dict[str, str]:
    """The dumps (``a``, ``b``) a compare result's summary.json names (empty when none)."""
    import json

    try:
        doc = json.loads(read_regular(path, MAX_SUMMARY_BYTES))
    except (ValueError, RecursionError):
        raise ProbeError(f"{path}: not a compare summary (not JSON); choose a folder written by "
                         "probe compare --out") from None
    doc = doc if isinstance(doc, dict) else {}
    return {k: str(doc[k]) for k in SIDES if isinstance(doc.get(k), (str, os.PathLike)) and doc[k]}


class Catalog:
    """The runs and compare results under ``roots``, and the diffs opened from them."""

    def __init__(self, roots: Iterable[str | os.PathLike], keep: int = 6,
                 checks: Mapping[str | os.PathLike, str | os.PathLike] | None = None) -> None:
        self.roots = list(dict.fromkeys(Path(r).resolve() for r in roots))
        #: the folders the user gave: a root added later must lie under one of them
        self.given = tuple(self.roots)
        self.keep = keep
        #: run folder -> the API precision check result given for it (``probe web --check``)
        self.checks = {str(run_folder(k)): str(v) for k, v in (checks or {}).items()}
        self._opened: OrderedDict[str, Opened] = OrderedDict()
        self._pinned: str | None = None
        self._lock = threading.Lock()

    def add_root(self, path: str | os.PathLike, within: Iterable[str | os.PathLike] = ()) -> bool:
        """Let the page open the runs under ``path`` too (the live page adds the folder of each
        targeted dump the monitor reports done), when ``path`` (symlinks resolved) lies under a
        folder the user gave: a root the catalog started with, or one of ``within`` (the live
        page's ``--store`` runs). A path from elsewhere (a monitor client names any path it
        likes) is not added: returns False and says so in the log."""
        p = Path(path).resolve()
        given = [*self.given, *(Path(w).resolve() for w in within)]
        if not any(p == g or p.is_relative_to(g) for g in given):
            log.warning("%s: a reported dump outside the folders this dashboard was started on; "
                        "not opened (start probe web with --store RUN or --dump under it)", p)
            return False
        with self._lock:
            if p not in self.roots:
                self.roots.append(p)
        return True

    # -- what there is ----------------------------------------------------------------------

    def _folders(self) -> list[Path]:
        out = []
        for root in self.roots:
            if root.is_dir():
                out += [root] + sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        return out

    def runs(self) -> list[str]:
        """The run folders under the roots (holding dumps or a record store)."""
        return [str(p) for p in self._folders()
                if (p / STORE_DIRNAME).is_dir() or any(True for pat in _STEP_DIRS for _ in p.glob(pat))]

    def compares(self) -> list[str]:
        """The compare result folders under the roots."""
        return [str(p) for p in self._folders() if all((p / f).is_file() for f in COMPARE_FILES)]

    def steps_ranks(self, run: str) -> tuple[list[int], list[int]]:
        """The steps and ranks a run's dumps hold (empty when it names them not)."""
        path = self.check(run)
        steps, ranks = set(), set()
        for f in find_dump_files(path):
            s, r = step_rank(f.relative_to(path) if f.is_relative_to(path) else f)
            if s is not None:
                steps.add(s)
            if r is not None:
                ranks.add(r)
        return sorted(steps), sorted(ranks)

    def check(self, path: str) -> Path:
        """``path`` resolved, when it lies under a root; else the error says where to look."""
        p = Path(path).expanduser().resolve()
        if not any(p == r or p.is_relative_to(r) for r in self.roots):
            where = ", ".join(map(str, self.roots)) or "(none: start with probe web --dump A [B])"
            raise ProbeError(f"{path}: not under the folders this dashboard was started on ({where}); "
                             "choose a run listed here")
        if not p.exists():
            raise ProbeError(f"{path}: no such folder; choose a run listed here")
        return p

    # -- opening ----------------------------------------------------------------------------

    def add(self, choice: Choice, diff: DiffGraph) -> Opened:
        """Keep an already built diff as the choice's (the one the dashboard started on)."""
        opened = Opened(choice, diff, checks=self._checks_of(diff))
        with self._lock:
            self._opened[choice.key] = opened
            self._pinned = self._pinned or choice.key
        return opened

    def get(self, key: str) -> Opened | None:
        """An opened choice by its key, if it is still kept."""
        with self._lock:
            return self._opened.get(key)

    def open(self, choice: Choice) -> Opened:
        """The opened diff of ``choice`` (built now, or kept from before); see the module
        docstring for what is refused."""
        held = self.get(choice.key)
        if held is not None:
            return held
        if not choice.a and not choice.compare:
            raise ProbeError("choose dump A (a run folder), or a compare result")
        a = str(self.check(choice.a)) if choice.a else None
        b = str(self.check(choice.b)) if choice.b else None
        cmp = str(self.check(choice.compare)) if choice.compare else None
        if cmp and not all((Path(cmp) / f).is_file() for f in COMPARE_FILES):
            raise ProbeError(f"{choice.compare}: not a compare result (no {', '.join(COMPARE_FILES)}); "
                             "choose a folder written by probe compare --out")
        if cmp and not (a and b):                  # the dumps its summary names: under the roots too
            named = _summary_dumps(Path(cmp) / "summary.json")
            a = a or (str(self.check(named["a"])) if named.get("a") else None)
            b = b or (str(self.check(named["b"])) if named.get("b") else None)
        for path in (a, b):
            if path and not (Path(path) / STORE_DIRNAME).is_dir() and not find_dump_files(path):
                raise ProbeError(f"{path}: holds no dump (no step<N>/rank<R>/dump.json, no store/); "
                                 "choose a run folder")
        diff = DiffGraph.from_dumps(a, b, cmp, step=choice.step, rank=choice.rank)
        opened = Opened(choice, diff, checks=self._checks_of(diff))
        with self._lock:
            self._opened[choice.key] = opened
            while len(self._opened) > self.keep + 1:
                oldest = next(k for k in self._opened if k != self._pinned)
                del self._opened[oldest]
        return opened

    def _checks_of(self, diff: DiffGraph) -> dict[str, str | None]:
        """The check result given for each side's run folder (None: look next to the dump)."""
        out: dict[str, str | None] = {}
        for side in SIDES:
            g = diff.graphs.get(side)
            source = getattr(g, "source", None)
            out[side] = self.checks.get(str(run_folder(source))) if source is not None else None
        return out

    def rank_states(self, opened: Opened, side: str, name: str) -> list[dict[str, Any]]:
        """The node's verdict on every rank the two dumps of ``opened`` hold at its step, side by
        side: rank, state, impact (origin | affected | ""), whether it holds NaN/Inf, and
        whether it is the rank shown. A rank whose dumps lack the node says ``absent``."""
        c = opened.choice
        if not (c.a and c.b):
            raise ProbeError("a per-rank view needs two dumps; open dump A and dump B")
        steps_a, ranks_a = self.steps_ranks(c.a)
        _, ranks_b = self.steps_ranks(c.b)
        step = c.step if c.step is not None else (steps_a[0] if steps_a else None)
        shown = c.rank if c.rank is not None else (ranks_a[0] if ranks_a else None)
        out = []
        for rank in sorted(set(ranks_a) & set(ranks_b)):
            diff = opened.diff if rank == shown else self.open(Choice(c.a, c.b, None, step, rank)).diff
            g = diff.graphs[side]
            if g is None or name not in g:
                out.append({"rank": rank, "state": "absent", "impact": "", "nan": False, "shown": rank == shown})
                continue
            out.append({"rank": rank, "state": diff.state(side, name), "impact": diff.impact(side, name)[0],
                        "nan": diff.nonfinite(side, name), "shown": rank == shown})
        return out
