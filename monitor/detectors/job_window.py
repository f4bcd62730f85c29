"""A job's rolling window of its last complete steps, as the service's detector thread keeps it: a
:class:`~probe.monitor.detectors.step_matrix.StepMatrix` whose derived series
(:func:`probe.monitor.detectors.step_detectors.derive`) are computed once per new row, judged by the
step detectors of :mod:`probe.monitor.detectors.step_detectors`.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from probe.monitor.detectors import step_detectors
from probe.monitor.detectors.step_matrix import StepMatrix

#: Steps the rolling window of a job keeps: the detectors' noise history.
WINDOW_STEPS = step_detectors.HISTORY


class JobWindow:
    """The last ``size`` complete steps of one job as a
    :class:`~probe.monitor.detectors.step_matrix.StepMatrix`.

    Rows live in buffers of twice ``size`` rows, moved to the front once per ``size`` steps,
    so appending a step copies one row per series, not the window; the detectors' series
    (:func:`probe.monitor.detectors.step_detectors.derive`) are computed for the new rows only.

    >>> w = JobWindow("j", size=3)
    >>> w.append(StepMatrix.of([{"rank": r, "step": s, "step_time_ms": 10.0} for s in range(5)
    ...                         for r in range(2)]))
    >>> w.matrix.steps.tolist(), w.matrix.derived["x_own"].shape
    ([2, 3, 4], (3, 2))
    """

    def __init__(self, job: str, size: int = WINDOW_STEPS) -> None:
        self.job, self.size, self.cap = job, size, 2 * size
        self.ranks = np.zeros(0, np.int64)
        self._steps = np.zeros(self.cap, np.int64)
        self._cols: dict[str, np.ndarray] = {}
        self._reported: dict[str, np.ndarray] = {}
        self._derived: dict[str, np.ndarray] = {}
        self._lo = self._hi = 0
        self.matrix = self._view()

    def _view(self) -> StepMatrix:
        lo, hi = self._lo, self._hi
        return StepMatrix(self._steps[lo:hi], self.ranks,
                          {k: v[lo:hi] for k, v in self._cols.items()}, self.job,
                          derived={k: v[lo:hi] for k, v in self._derived.items()},
                          reported={k: v[lo:hi] for k, v in self._reported.items()})

    def _widen(self, ranks: np.ndarray) -> None:
        """Lay the buffers over ``ranks`` (a superset of the ranks held)."""
        where = np.searchsorted(ranks, self.ranks)
        for bufs in (self._cols, self._reported, self._derived):
            for k, v in bufs.items():
                if k != "job":                          # the one series per step, not per rank
                    w = np.full((self.cap, len(ranks)) + v.shape[2:], _nothing(v), v.dtype)
                    w[:, where] = v
                    bufs[k] = w
        self.ranks = ranks

    def _compact(self, room: int) -> None:
        """Make ``room`` free rows at the end, keeping the last ``size`` rows held."""
        if self._hi + room <= self.cap:
            return
        keep = min(self.size, self._hi - self._lo)
        src = slice(self._hi - keep, self._hi)
        for bufs in (self._cols, self._reported, self._derived):
            for v in bufs.values():
                v[:keep] = v[src]
        self._steps[:keep] = self._steps[src]
        self._lo, self._hi = 0, keep

    def append(self, new: StepMatrix) -> None:
        """Add the steps of ``new`` later than those held (at most ``size`` of them: after a
        longer gap only the last ``size`` are judged), keep the last ``size``, and derive the
        detectors' series for the new rows."""
        last = self._steps[self._hi - 1] if self._hi > self._lo else -1
        keep = np.flatnonzero(new.steps > last)[-self.size:]
        if keep.size == 0:
            return
        new = new.take(keep)
        k = keep.size
        ranks = np.union1d(self.ranks, new.ranks)
        if len(ranks) != len(self.ranks):
            self._widen(ranks)
        self._compact(k)
        at = slice(self._hi, self._hi + k)
        cols_of = np.searchsorted(self.ranks, new.ranks)
        for bufs, got, fill in ((self._cols, new.cols, np.nan),
                                (self._reported, new.reported, False)):
            for name in set(bufs) | set(got):
                if name not in bufs:
                    bufs[name] = np.full((self.cap, len(self.ranks)), fill,
                                         dtype=bool if fill is False else float)
                buf = bufs[name]
                buf[at] = fill
                if name in got:
                    buf[at, cols_of] = got[name]
        self._steps[at] = new.steps
        self._hi += k
        self._lo = max(self._lo, self._hi - self.size)
        view = self._view()
        for name, rows in step_detectors.derive(view, len(view.steps) - k).items():
            buf = self._derived.get(name)
            if buf is None:
                buf = self._derived[name] = np.full((self.cap,) + rows.shape[1:],
                                                    _nothing(rows), rows.dtype)
            buf[at] = rows
        self.matrix = self._view()

    def step_times(self) -> list[float]:
        """The job's step time per step held (median over ranks), oldest first."""
        job = self.matrix.derived.get("job")
        if job is None:
            return []
        return [float(v) for v in job[:, 0] if np.isfinite(v)]

    def judge(self, steps: Iterable[int]) -> list[dict[str, Any]]:
        """Every step detector on ``steps`` (held in the window)."""
        return step_detectors.detect(self.matrix, list(steps), job=self.job)


def _nothing(like: np.ndarray) -> Any:
    """The value of an empty cell: -1 for level bins, 0 for counts, False, or NaN."""
    if like.dtype == np.int8:
        return -1
    if like.dtype == bool:
        return False
    return 0 if np.issubdtype(like.dtype, np.integer) else np.nan

