"""The service's rolling window of one job's per-module numerics, judged step by step.

:class:`NumericsWindow` keeps the last :data:`~probe.monitor.detectors.numerics_evidence.HISTORY`
complete steps of a job's ``numerics:*`` points as a
:class:`~probe.monitor.detectors.module_matrix.ModuleMatrix` (the detectors' history) in buffers of
twice that many rows, moved to the front once per ``size`` steps, so appending a step copies one row
per series, not the window; the detectors' level bins are computed for the new rows only
(:func:`probe.monitor.detectors.numerics_evidence.derive`).

>>> w = NumericsWindow("j", size=3)
>>> w.append(ModuleMatrix.of([{"rank": 0, "step": s, "module": "fc", "grad_norm": 1.0}
...                           for s in range(5)]))
>>> w.matrix.steps.tolist(), w.matrix.derived["z:grad_norm"].shape
([2, 3, 4], (3, 1, 1))
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from probe.monitor.detectors import numerics as nd
from probe.monitor.detectors import numerics_evidence as ne
from probe.monitor.detectors.module_matrix import ModuleMatrix
from probe.monitor.numerics_names import QUANTITIES

#: Steps the window keeps: the detectors' noise history.
WINDOW_STEPS = ne.HISTORY


class NumericsWindow:
    """The last ``size`` complete steps of one job's numerics; see the module docstring."""

    def __init__(self, job: str, size: int = WINDOW_STEPS) -> None:
        self.job, self.size, self.cap = job, size, 2 * size
        self.ranks = np.zeros(0, np.int64)
        self.modules: list[str] = []
        self._steps = np.zeros(self.cap, np.int64)
        self._bufs: dict[str, np.ndarray] = {}         # quantity / "times" / test -> [cap, R, M]
        self._sums: dict[str, np.ndarray] = {}         # test# -> [cap, M, 1 + 3L]
        self._lo = self._hi = 0
        self.matrix = self._view()

    def _view(self) -> ModuleMatrix:
        lo, hi = self._lo, self._hi
        shape = (hi - lo, len(self.ranks), len(self.modules))
        values = {q: self._bufs[q][lo:hi] if q in self._bufs else np.full(shape, np.nan)
                  for q in QUANTITIES}
        times = self._bufs["times"][lo:hi] if "times" in self._bufs else np.zeros(shape, np.int64)
        derived = {k: v[lo:hi] for k, v in self._bufs.items() if k in ne.TESTS}
        derived.update({k: v[lo:hi] for k, v in self._sums.items()})
        return ModuleMatrix(self._steps[lo:hi], self.ranks, self.modules, values, times,
                            self.job, derived=derived)

    @staticmethod
    def _empty(name: str) -> Any:
        if name == "times":
            return np.int64, 0
        if name in ne.TESTS:
            return np.int8, -1
        return float, np.nan

    def _widen(self, ranks: np.ndarray, modules: list[str]) -> None:
        """Lay the buffers over ``ranks`` and ``modules`` (supersets of those held)."""
        r_at = np.searchsorted(ranks, self.ranks)
        m_at = np.array([modules.index(m) for m in self.modules], dtype=np.int64)
        for name, old in list(self._bufs.items()):
            dtype, fill = self._empty(name)
            new = np.full((self.cap, len(ranks), len(modules)), fill, dtype)
            new[np.ix_(np.arange(self.cap), r_at, m_at)] = old
            self._bufs[name] = new
        for name, old in list(self._sums.items()):
            new = np.zeros((self.cap, len(modules), old.shape[2]), np.int64)
            new[:, m_at] = old
            self._sums[name] = new
        self.ranks, self.modules = ranks, modules

    def _compact(self, room: int) -> None:
        if self._hi + room <= self.cap:
            return
        keep = min(self.size, self._hi - self._lo)
        src = slice(self._hi - keep, self._hi)
        for bufs in (self._bufs, self._sums):
            for v in bufs.values():
                v[:keep] = v[src]
        self._steps[:keep] = self._steps[src]
        self._lo, self._hi = 0, keep

    def append(self, new: ModuleMatrix) -> None:
        """Add the steps of ``new`` later than those held (at most ``size``), keep the last
        ``size``, and derive the detectors' bins for the new rows."""
        last = self._steps[self._hi - 1] if self._hi > self._lo else -1
        keep = np.flatnonzero(new.steps > last)[-self.size:]
        if keep.size == 0:
            return
        k = keep.size
        ranks = np.union1d(self.ranks, new.ranks)
        modules = self.modules + [m for m in new.modules if m not in set(self.modules)]
        if len(ranks) != len(self.ranks) or len(modules) != len(self.modules):
            self._widen(ranks, modules)
        self._compact(k)
        at = slice(self._hi, self._hi + k)
        r_of = np.searchsorted(self.ranks, new.ranks)
        index = {m: i for i, m in enumerate(self.modules)}
        m_of = np.array([index[m] for m in new.modules], dtype=np.int64)
        R, M = len(self.ranks), len(self.modules)
        got = dict(new.values, times=new.times)
        for name in list(QUANTITIES) + ["times"]:
            dtype, fill = self._empty(name)
            buf = self._bufs.get(name)
            if buf is None:
                buf = self._bufs[name] = np.full((self.cap, R, M), fill, dtype)
            buf[at] = fill
            buf[self._hi:self._hi + k, r_of[:, None], m_of[None, :]] = got[name][keep]
        self._steps[at] = new.steps[keep]
        self._hi += k
        if self._hi - self._lo > self.size:
            self._lo = self._hi - self.size
        view = self._view()
        start = len(view.steps) - k
        # a test's bins of the rows before ``start`` are the history derive() goes on from
        for name, rows in ne.derive(view, start).items():
            if name.endswith("#"):
                buf = self._sums.get(name)
                if buf is None:
                    buf = self._sums[name] = np.zeros((self.cap,) + rows.shape[1:], np.int64)
            else:
                buf = self._bufs.get(name)
                if buf is None:
                    buf = self._bufs[name] = np.full((self.cap, R, M), -1, np.int8)
            buf[at] = rows
        self.matrix = self._view()

    def judge(self, steps: Iterable[int]) -> list[dict[str, Any]]:
        """Every numerics detector on ``steps`` (held in the window)."""
        return nd.detect(self.matrix, list(steps), job=self.job)
