"""The numerics detectors' input: per-(step, rank, module) values of each quantity of
:mod:`probe.monitor.numerics_names`, from the monitor store's ``numerics:*`` points or from rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from probe.monitor.numerics_names import QUANTITIES, parse_metric_name


@dataclass
class ModuleMatrix:
    """Per-(step, rank, module) values of each numerics quantity.

    ``values[q]`` is ``[len(steps), len(ranks), len(modules)]`` (NaN: not reported);
    ``times`` the time_ns of the points (0: none), for the modules' execution order;
    ``derived`` caches the tests' level bins (filled by :func:`derive`).

    >>> m = ModuleMatrix.from_points([{"rank": 0, "step": 3, "name": "numerics:fc:grad_norm",
    ...                                "value": 2.0, "time_ns": 7}, {"rank": 0, "step": 3,
    ...                                "name": "loss", "value": 1.0}])
    >>> m.modules, m.values["grad_norm"].tolist(), m.times.tolist()
    (['fc'], [[[2.0]]], [[[7]]])
    """

    steps: np.ndarray
    ranks: np.ndarray
    modules: list[str]
    values: dict[str, np.ndarray]
    times: np.ndarray
    job: str | None = None
    derived: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_points(cls, table: Any, job: str | None = None) -> "ModuleMatrix":
        """From metric points (``rank``, ``step``, ``name``, ``value``, optional ``time_ns``):
        an Arrow table or row dicts; names that are not numerics names are left out."""
        if hasattr(table, "column_names"):
            return cls._from_arrow(table, job)
        rows = list(table)
        cols = {n: [r.get(n) for r in rows] for n in ("rank", "step", "name", "value")}
        cols["time_ns"] = [r.get("time_ns") or 0 for r in rows]
        parsed: dict[str, tuple[str, str] | None] = {}
        keep_r, keep_s, keep_m, keep_q, keep_v, keep_t = [], [], [], [], [], []
        for r, s, n, v, t in zip(cols["rank"], cols["step"], cols["name"], cols["value"],
                                 cols["time_ns"]):
            mq = parsed.get(n)
            if mq is None and n not in parsed:
                mq = parsed[n] = parse_metric_name(n)
            if mq is None:
                continue
            keep_r.append(r), keep_s.append(s), keep_m.append(mq[0]), keep_q.append(mq[1])
            keep_v.append(math.nan if v is None else v), keep_t.append(t or 0)
        modules = list(dict.fromkeys(keep_m))
        return cls.build(keep_r, keep_s, keep_m, keep_q, keep_v, keep_t, modules, job)

    @classmethod
    def _from_arrow(cls, table: Any, job: str | None) -> "ModuleMatrix":
        """:meth:`from_points` of an Arrow table, column by column (each name parsed once)."""
        name = table.column("name").combine_chunks().dictionary_encode()
        labels = [parse_metric_name(n) for n in name.dictionary.to_pylist()]
        codes = np.asarray(name.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        modules = list(dict.fromkeys(mq[0] for mq in labels if mq is not None))
        where = {m: i for i, m in enumerate(modules)}
        q_index = {q: i for i, q in enumerate(QUANTITIES)}
        mod_of = np.array([where[mq[0]] if mq else -1 for mq in labels] + [-1], dtype=np.int64)
        q_of = np.array([q_index[mq[1]] if mq else -1 for mq in labels] + [-1], dtype=np.int64)
        mi, qi = mod_of[codes], q_of[codes]
        ok = mi >= 0

        def col(n: str, dtype: Any) -> np.ndarray:
            if n not in table.column_names:
                return np.zeros(table.num_rows, dtype)
            return np.asarray(table.column(n).to_numpy(zero_copy_only=False), dtype=dtype)

        rank, step = col("rank", np.int64)[ok], col("step", np.int64)[ok]
        value = np.nan_to_num(col("value", float), nan=np.nan)[ok]
        times = col("time_ns", np.float64)[ok]
        mi, qi = mi[ok], qi[ok]
        st, si = np.unique(step, return_inverse=True)
        rk, ri = np.unique(rank, return_inverse=True)
        shape = (len(st), len(rk), len(modules))
        values = {}
        for q, i in q_index.items():
            at = qi == i
            grid = np.full(shape, np.nan)
            grid[si[at], ri[at], mi[at]] = value[at]
            values[q] = grid
        tm = np.zeros(shape, dtype=np.int64)
        tm[si, ri, mi] = np.nan_to_num(times, nan=0.0).astype(np.int64)
        return cls(st, rk, modules, values, tm, job)

    @classmethod
    def of(cls, table: Any, job: str | None = None) -> "ModuleMatrix":
        """A matrix from itself, from points (:meth:`from_points`) or from wide rows
        (``rank``, ``step``, ``module`` and quantities as keys; ``time_ns`` optional)."""
        if isinstance(table, ModuleMatrix):
            return table
        if not hasattr(table, "column_names"):
            rows = list(table)
            if rows and "module" in rows[0]:
                r, s, m, q, v, t = [], [], [], [], [], []
                for row in rows:
                    for quantity in QUANTITIES:
                        if quantity in row:
                            r.append(row["rank"]), s.append(row["step"]), m.append(row["module"])
                            q.append(quantity), v.append(row[quantity])
                            t.append(row.get("time_ns") or 0)
                return cls.build(r, s, m, q, v, t, list(dict.fromkeys(m)), job)
            table = rows
        return cls.from_points(table, job)

    @classmethod
    def build(cls, ranks: list, steps: list, modules_of: list, quantities: list, values: list,
              times: list, modules: list[str], job: str | None) -> "ModuleMatrix":
        st, si = np.unique(np.asarray(steps, dtype=np.int64), return_inverse=True)
        rk, ri = np.unique(np.asarray(ranks, dtype=np.int64), return_inverse=True)
        where = {m: i for i, m in enumerate(modules)}
        mi = np.fromiter((where[m] for m in modules_of), dtype=np.int64, count=len(modules_of))
        q = np.asarray(quantities, dtype=object)
        v = np.asarray(values, dtype=float)
        shape = (len(st), len(rk), len(modules))
        out = {}
        for quantity in QUANTITIES:
            at = q == quantity
            grid = np.full(shape, np.nan)
            if at.any():
                grid[si[at], ri[at], mi[at]] = v[at]
            out[quantity] = grid
        tm = np.zeros(shape, dtype=np.int64)
        tm[si, ri, mi] = np.asarray(times, dtype=np.int64)
        return cls(st, rk, list(modules), out, tm, job)

    def rows_of(self, steps: Iterable[int] | None) -> list[int]:
        """Row indices of the wanted steps that the matrix has (all rows when None)."""
        if steps is None:
            return list(range(len(self.steps)))
        index = {int(s): i for i, s in enumerate(self.steps)}
        return sorted(index[int(s)] for s in steps if int(s) in index)

