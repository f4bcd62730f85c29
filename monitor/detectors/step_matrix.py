"""The detectors' input: per-(step, rank) series as a :class:`StepMatrix`, from the monitor
store's tables or from rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

#: An alert: ``kind``, ``job``, ``rank``, ``step``, ``message`` and ``evidence``.
Alert = dict[str, Any]

TIMING_COLUMNS = ("step_time_ms", "compute_time_ms", "compute_cpu_ms", "comm_time_ms", "data_time_ms")
MEMORY_COLUMNS = ("device_mem_mb", "proc_rss_mb")
#: Columns whose NaN/Inf is news (:func:`nonfinite`), not a missing value.
CHECKED_COLUMNS = ("loss", "grad_norm", "nonfinite_grads")


@dataclass
class StepMatrix:
    """Per-(step, rank) series: ``cols[name]`` is a float array ``[len(steps), len(ranks)]``
    with NaN where a rank did not report the metric at that step.

    ``derived`` caches series computed from the columns (see :func:`peer_excess`); a caller
    that keeps a matrix across calls (the service's rolling window) fills it once per row.

    >>> m = StepMatrix.of([{"rank": 1, "step": 4, "loss": 2.0}, {"rank": 0, "step": 5, "loss": 1.5}])
    >>> m.steps.tolist(), m.ranks.tolist(), m.col("loss").tolist()
    ([4, 5], [0, 1], [[nan, 2.0], [1.5, nan]])
    """

    steps: np.ndarray
    ranks: np.ndarray
    cols: dict[str, np.ndarray]
    job: str | None = None
    derived: dict[str, np.ndarray] = field(default_factory=dict)
    #: for the columns of :data:`CHECKED_COLUMNS`: where a value was reported at all (NaN in
    #: ``cols`` is also "not reported"; a reported NaN loss is what :func:`nonfinite` looks for)
    reported: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, table: Any, job: str | None = None) -> "StepMatrix":
        """A matrix from an Arrow table, a list of row dicts, or a matrix (returned as is)."""
        if isinstance(table, StepMatrix):
            return table
        if hasattr(table, "read_all"):                       # an Arrow record batch reader
            table = table.read_all()
        if hasattr(table, "column_names"):
            names = [n for n in table.column_names if n not in ("rank", "step", "job", "time_ns")]
            rank = np.asarray(table.column("rank").to_numpy(zero_copy_only=False), dtype=np.int64)
            step = np.asarray(table.column("step").to_numpy(zero_copy_only=False), dtype=np.int64)
            values = {n: np.asarray(table.column(n).to_numpy(zero_copy_only=False), dtype=float)
                      for n in names}
            given = {n: ~np.asarray(table.column(n).is_null().to_numpy(zero_copy_only=False),
                                    dtype=bool) for n in names if n in CHECKED_COLUMNS}
            if job is None and "job" in table.column_names and table.num_rows:
                job = table.column("job")[0].as_py()
        else:
            rows = list(table)
            names = sorted({k for r in rows for k in r} - {"rank", "step", "job", "time_ns"})
            rank = np.array([int(r["rank"]) for r in rows], dtype=np.int64)
            step = np.array([int(r["step"]) for r in rows], dtype=np.int64)
            values = {n: np.array([_float(r.get(n)) for r in rows], dtype=float) for n in names}
            given = {n: np.array([r.get(n) is not None for r in rows], dtype=bool)
                     for n in names if n in CHECKED_COLUMNS}
            if job is None and rows:
                job = rows[0].get("job")
        steps, si = np.unique(step, return_inverse=True)
        ranks, ri = np.unique(rank, return_inverse=True)
        cols, reported = {}, {}
        for n, v in values.items():
            m = np.full((len(steps), len(ranks)), np.nan)
            m[si, ri] = v
            cols[n] = m
        for n, g in given.items():
            mask = np.zeros((len(steps), len(ranks)), dtype=bool)
            mask[si, ri] = g
            reported[n] = mask
        return cls(steps, ranks, cols, job, reported=reported)

    @classmethod
    def from_points(cls, table: Any, job: str | None = None) -> "StepMatrix":
        """A matrix from metric points in long form (``rank``, ``step``, ``name``, ``value``),
        as the store keeps them; a value given twice keeps the last.

        >>> import pyarrow as pa
        >>> m = StepMatrix.from_points(pa.table({"rank": [0, 1, 1], "step": [3, 3, 3],
        ...                                      "name": ["loss", "loss", "grad_norm"],
        ...                                      "value": [2.0, float("nan"), 1.0]}))
        >>> m.col("loss").tolist(), m.reported["loss"].tolist()
        ([[2.0, nan]], [[True, True]])
        """
        rank = np.asarray(table.column("rank").to_numpy(zero_copy_only=False), dtype=np.int64)
        step = np.asarray(table.column("step").to_numpy(zero_copy_only=False), dtype=np.int64)
        value = np.asarray(table.column("value").to_numpy(zero_copy_only=False), dtype=float)
        name = table.column("name").combine_chunks().dictionary_encode()
        labels = name.dictionary.to_pylist()
        codes = np.asarray(name.indices.to_numpy(zero_copy_only=False))
        steps, si = np.unique(step, return_inverse=True)
        ranks, ri = np.unique(rank, return_inverse=True)
        cols, reported = {}, {}
        for code, label in enumerate(labels):
            at = codes == code
            grid = np.full((len(steps), len(ranks)), np.nan)
            grid[si[at], ri[at]] = value[at]
            cols[label] = grid
            if label in CHECKED_COLUMNS:
                mask = np.zeros(grid.shape, dtype=bool)
                mask[si[at], ri[at]] = True
                reported[label] = mask
        return cls(steps, ranks, cols, job, reported=reported)

    def col(self, name: str) -> np.ndarray:
        """The column ``name``, all NaN when no rank reported it."""
        got = self.cols.get(name)
        return got if got is not None else np.full((len(self.steps), len(self.ranks)), np.nan)

    def take(self, rows: Any) -> "StepMatrix":
        """The matrix of ``rows`` (indices, a slice or a mask), its columns and reported masks
        with them (not the derived series).

        >>> m = StepMatrix.of([{"rank": 0, "step": s, "loss": float(s)} for s in range(4)])
        >>> m.take(slice(2, 3)).steps.tolist(), m.take([0, 3]).col("loss").tolist()
        ([2], [[0.0], [3.0]])
        """
        return StepMatrix(self.steps[rows], self.ranks, {k: v[rows] for k, v in self.cols.items()},
                          self.job, reported={k: v[rows] for k, v in self.reported.items()})

    def rows_of(self, steps: Iterable[int] | None) -> list[int]:
        """Row indices of the wanted steps that the matrix has (all rows when None)."""
        if steps is None:
            return list(range(len(self.steps)))
        index = {int(s): i for i, s in enumerate(self.steps)}
        return sorted(index[int(s)] for s in steps if int(s) in index)


def _float(v: Any) -> float:
    if v is None or isinstance(v, (str, bytes)):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
