"""Numerics detectors: pure functions over the per-module series of ``numerics:*`` points.

The input is a :class:`ModuleMatrix`: for each quantity of :mod:`monitor.numerics_names` an
array ``[steps, ranks, modules]`` (NaN where nothing was reported), and the time of each point
(the callback stamps a module's points with the time of its forward pass: the modules'
execution order). A *series* is one (rank, module, quantity). Each detector judges the steps
asked (all when None) and uses the earlier rows as history; an alert is a dict like the timing
detectors' (``kind``, ``job``, ``rank``, ``step``, ``message`` with the evidence in words,
``evidence``) plus ``module`` and ``quantity``; :func:`detect` runs them all and makes one
alert of those that name the same module, quantity and step on several ranks.

- :func:`outliers` (``numerics_outlier``): a value far outside its own recent history: the
  robust z-score of its log against the median and MAD of its previous :data:`BASELINE` steps
  (the MAD at least :data:`Z_FLOOR`, 10%: a weight whose norm hardly moves is not alerted
  for a 50% change), at levels :data:`Z_LEVELS`, both ways (a gradient that vanishes too);
- :func:`layer_ratios` (``numerics_layer_ratio``): the ratio of a module's norm (gradient,
  weight, activation) to the other modules' of its rank breaks its pattern: over the last
  :data:`LAG` steps it moved by a factor :data:`RATIO_LEVELS` more than the median module's
  did (a layer whose weights grow while the others' stay, gradients that vanish in one layer);
- :func:`large_updates` (``numerics_update``): the optimizer step changed a weight by a large
  fraction of itself (``update_ratio`` above :data:`UPDATE_LEVELS`, 10% and more);
- :func:`nonfinite_modules` (``numerics_nonfinite``): NaN/Inf in a module's output, weights or
  gradients (the ``nonfinite`` count, or a norm that overflowed to Inf), at the first step of a
  rank where it appears, naming the first module in execution order that has it.

The first three judge like the timing detectors (:mod:`monitor.detectors`, rules 3 and 4): the
noise is measured on the job (how often the series of the *other* modules, on every rank,
exceed each level over the last :data:`HISTORY` steps, and how often an excess runs on into
the next step; the same module on another rank is no witness: data-parallel ranks hold the
same weights) and an
alert needs the excess in ``k`` of the last ``n`` steps (``n`` in :data:`WINDOWS`, ``k`` at
least 3), with ``k`` so many that its chance under that noise is below
:data:`~monitor.noise_model.ALPHA` shared by the series judged. A series is judged once it has
:data:`MIN_BASELINE` earlier steps: the first steps of a run (Adam's warm-up moves everything)
are history only.

The detectors' per-step work is cached in ``ModuleMatrix.derived`` (the level bins of each
test, and their sums over the series); the service's rolling window
(:class:`monitor.numerics_window.NumericsWindow`) computes them once per new step.

>>> rows = [{"rank": 0, "step": s, "module": m, "weight_norm": 10.0 * (1.25 ** max(0, s - 20)
...          if m == "l3" else 1.0 + 0.001 * s)} for s in range(40) for m in ("l0", "l1", "l2", "l3")]
>>> [(a["kind"], a["module"], a["quantity"], a["step"]) for a in detect(rows)][:1]
[('numerics_outlier', 'l3', 'weight_norm', 27)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from monitor.noise_model import ALPHA, RUN_PRIOR, run_chance
from monitor.numerics_names import QUANTITIES, parse_metric_name

#: The alert kinds of this module.
KINDS = ("numerics_outlier", "numerics_layer_ratio", "numerics_update", "numerics_nonfinite")
#: Quantities judged against their own history (their logs).
OWN_QUANTITIES = ("activation_norm", "weight_norm", "grad_norm", "optimizer_state_norm",
                  "update_ratio")
#: Quantities whose ratio between modules is judged.
LAYER_QUANTITIES = ("grad_norm", "weight_norm", "activation_norm")
#: Steps of history the noise is measured over (and the service's window keeps).
HISTORY = 100
#: The own-history baseline: the median and MAD of at most this many earlier steps...
BASELINE = 30
#: ...and of at least this many (a series is judged from then on).
MIN_BASELINE = 10
#: Robust z-score levels (in MADs, scaled as standard deviations) of :func:`outliers`.
Z_LEVELS = (6.0, 10.0, 20.0, 50.0)
#: The least spread a baseline is given, in log units: a 10% change (the smooth series, a
#: weight's norm, Adam's moments, hardly spread; a z-score of 6 is then a 1.8x change).
Z_FLOOR = math.log(1.1)
#: Steps over which :func:`layer_ratios` compares a module's change with the others'.
LAG = 5
#: Factors by which a module's ratio to the median module may move over :data:`LAG` steps.
RATIO_LEVELS = (2.0, 4.0, 10.0, 100.0)
#: The fewest modules of a rank for a median module to mean something.
MIN_MODULES = 3
#: Update ratio levels of :func:`large_updates`: the step changed the weight by 10%, 20%, ...
UPDATE_LEVELS = (0.1, 0.2, 0.5, 1.0)
#: The k-of-n windows (the last n judged steps).
WINDOWS = (5, 10, 20)

#: test name -> (quantities, levels) of the level-binned tests
_TESTS: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {
    **{f"z:{q}": ((q,), Z_LEVELS) for q in OWN_QUANTITIES},
    **{f"r:{q}": ((q,), RATIO_LEVELS) for q in LAYER_QUANTITIES},
    "u:update_ratio": (("update_ratio",), UPDATE_LEVELS),
}

Alert = dict[str, Any]


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


# -- the tests' level bins ----------------------------------------------------------------------

def _log(values: np.ndarray) -> np.ndarray:
    """log of the finite positive values, NaN elsewhere."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = np.isfinite(values) & (values > 0)
        return np.where(ok, np.log(np.where(ok, values, 1.0)), np.nan)


def _median0(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(median over axis 0 ignoring NaN, count of non-NaN) of ``a``."""
    srt = np.sort(a, axis=0)                                      # NaN sort last
    n = (~np.isnan(a)).sum(axis=0)
    i1, i2 = np.maximum(n - 1, 0) // 2, np.minimum(n // 2, a.shape[0] - 1)
    med = 0.5 * (np.take_along_axis(srt, i1[None], 0)[0] + np.take_along_axis(srt, i2[None], 0)[0])
    return np.where(n > 0, med, np.nan), n


def _bins(dev: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """How many of ``levels`` each deviation reaches; -1 where it is NaN."""
    out = np.searchsorted(np.asarray(levels), np.nan_to_num(dev, nan=-np.inf),
                          side="right").astype(np.int8)
    out[np.isnan(dev)] = -1
    return out


def _row_bins(m: ModuleMatrix, row: int, logs: dict[str, np.ndarray],
              first: int = 0) -> dict[str, np.ndarray]:
    """Every test's level bins ``[ranks, modules]`` at ``row`` (earlier rows as history);
    ``logs`` holds the logs of the rows from ``first`` on."""
    out = {}
    lo = max(0, row - BASELINE)
    for q in OWN_QUANTITIES:
        x = logs[q]
        if row - lo < MIN_BASELINE:
            out[f"z:{q}"] = np.full(x.shape[1:], -1, np.int8)
            continue
        base = x[lo - first:row - first]
        med, n = _median0(base)
        mad, _ = _median0(np.abs(base - med[None]))
        z = np.abs(x[row - first] - med) / np.maximum(1.4826 * mad, Z_FLOOR)
        z[n < MIN_BASELINE] = np.nan
        out[f"z:{q}"] = _bins(z, Z_LEVELS)
    for q in LAYER_QUANTITIES:
        x = logs[q]
        if row < LAG or row < MIN_BASELINE or x.shape[2] < MIN_MODULES:
            out[f"r:{q}"] = np.full(x.shape[1:], -1, np.int8)
            continue
        d = x[row - first] - x[row - LAG - first]                  # [ranks, modules]
        med, n = _median0(d.T)                                     # the median module per rank
        e = np.abs(d - med[:, None])
        e[n < MIN_MODULES] = np.nan
        out[f"r:{q}"] = _bins(np.exp(e), RATIO_LEVELS)
    u = m.values["update_ratio"][row].copy()
    seen = (~np.isnan(m.values["update_ratio"][:row])).sum(axis=0)
    u[seen < MIN_BASELINE] = np.nan
    u[~np.isfinite(u)] = np.nan
    out["u:update_ratio"] = _bins(u, UPDATE_LEVELS)
    return out


def _counts(bins: np.ndarray, prev: np.ndarray | None, L: int) -> np.ndarray:
    """Sums over the ranks of one row, per module: judged, reached each level, runs (this and
    the previous row reached it), starts (the previous reached it and this one is judged):
    ``[modules, 1 + 3L]``."""
    p = prev if prev is not None else np.full(bins.shape, -1, np.int8)
    out = np.empty((bins.shape[1], 1 + 3 * L), dtype=np.int64)
    judged = bins >= 0
    out[:, 0] = judged.sum(axis=0)
    for j in range(1, L + 1):
        hit, was = bins >= j, p >= j
        out[:, j] = hit.sum(axis=0)
        out[:, L + j] = (hit & was).sum(axis=0)
        out[:, 2 * L + j] = (was & judged).sum(axis=0)
    return out


def derive(m: ModuleMatrix, start: int = 0) -> dict[str, np.ndarray]:
    """The tests' level bins (``<test>``: ``[rows, ranks, modules]`` int8) and their sums over
    the ranks (``<test>#``: ``[rows, modules, 1 + 3 * levels]``) of the rows from ``start``; the rows
    before are history (and their bins, in ``m.derived``, the previous row's for the runs)."""
    S = len(m.steps)
    first = max(0, start - max(BASELINE, LAG))                     # the rows the tests read
    logs = {q: _log(m.values[q][first:]) for q in set(OWN_QUANTITIES) | set(LAYER_QUANTITIES)}
    shape = (len(m.ranks), len(m.modules))
    new: dict[str, list] = {name: [] for name in _TESTS}
    for row in range(start, S):
        for name, bins in _row_bins(m, row, logs, first).items():
            new[name].append(bins)
    out: dict[str, np.ndarray] = {}
    for name, (_, levels) in _TESTS.items():
        rows = np.stack(new[name]) if new[name] else np.zeros((0,) + shape, np.int8)
        before = m.derived.get(name)
        prev = before[start - 1] if start and before is not None and len(before) >= start else None
        sums = []
        for b in rows:
            sums.append(_counts(b, prev, len(levels)))
            prev = b
        out[name] = rows
        out[name + "#"] = np.array(sums, np.int64).reshape(-1, shape[1], 1 + 3 * len(levels))
    return out


def _ensure(m: ModuleMatrix) -> None:
    """Fill ``m.derived`` for the rows that lack it (all of them when any test lacks it)."""
    have = min((len(m.derived[n]) for n in _TESTS if n in m.derived), default=0)
    if any(n not in m.derived for n in _TESTS):
        have = 0
    if have >= len(m.steps):
        return
    new = derive(m, have)
    for name, rows in new.items():
        old = m.derived.get(name)
        m.derived[name] = rows if not have else np.concatenate([old[:have], rows])


@dataclass
class Finding:
    """The strongest persistent excess of one series at one step."""

    rank_col: int
    module_col: int
    level: float
    k: int
    n: int
    p: float
    chance: float
    first: int                                      # the window's first row


def _persistent(m: ModuleMatrix, test: str, row: int, alpha: float) -> list[Finding]:
    """The series of ``test`` whose excess at ``row`` ends a run unlikely under the noise
    measured on the other series (rules 3 and 4 of :mod:`monitor.detectors`)."""
    bins, sums = m.derived[test], m.derived[test + "#"]
    levels = _TESTS[test][1]
    L = len(levels)
    cur = bins[row]
    cand = np.argwhere(cur >= 1)                                     # [C, (rank, module)]
    if cand.size == 0:
        return []
    lo = max(0, row - HISTORY + 1)
    per_module = sums[lo:row + 1].sum(axis=0)                        # [modules, 1 + 3L]
    # the noise of the other modules (every rank): the same module on another rank of a
    # data-parallel job holds the same weights, so it is no independent witness
    others = (per_module.sum(axis=0)[None] - per_module[cand[:, 1]]).T  # [1 + 3L, C]
    hist = bins[lo:row + 1]
    series = max(1, int((hist >= 0).any(axis=0).sum()))
    cols = hist[:, cand[:, 0], cand[:, 1]]                           # [H, C]
    judged = cols >= 0
    hit = cols[None] >= np.arange(1, L + 1)[:, None, None]           # [L, H, C]
    V, E = others[0][None], others[1:1 + L]
    N11, N1 = others[1 + L:1 + 2 * L], others[1 + 2 * L:]
    p = np.minimum((E + 1.0) / (V + 2.0), 1.0)                       # [L, C]
    p11 = np.maximum((N11 + RUN_PRIOR * p) / (N1 + RUN_PRIOR), p)
    reached = cur[cand[:, 0], cand[:, 1]][None] >= np.arange(1, L + 1)[:, None]
    parts = []
    for w in WINDOWS:
        first = row - w + 1
        if first < lo:
            break
        k = hit[:, first - lo:].sum(axis=1)                          # [L, C]
        n = np.broadcast_to(judged[first - lo:].sum(axis=0)[None], k.shape)
        keep = (k >= 3) & (k > n * p + 4 * np.sqrt(n * p * (1 - p))) & reached
        if keep.any():
            li, ci = np.nonzero(keep)
            parts.append((li, ci, k[li, ci], n[li, ci], np.full(li.size, first)))
    if not parts:
        return []
    li, ci, k, n, first = (np.concatenate(x) for x in zip(*parts))
    chance = run_chance(k, n, p[li, ci], p11[li, ci])
    limit = alpha / series
    best: dict[int, Finding] = {}
    for i in np.flatnonzero(chance < limit):
        c, level = int(ci[i]), levels[int(li[i])]
        old = best.get(c)
        if old is not None and (old.level > level or old.level == level and old.chance <= chance[i]):
            continue
        best[c] = Finding(int(cand[c, 0]), int(cand[c, 1]), level, int(k[i]), int(n[i]),
                          float(p[li[i], c]), float(chance[i]), int(first[i]))
    return [best[c] for c in sorted(best)]


def _alert(m: ModuleMatrix, kind: str, row: int, f: Finding, quantity: str, message: str,
           evidence: dict[str, Any]) -> Alert:
    rank, step, module = int(m.ranks[f.rank_col]), int(m.steps[row]), m.modules[f.module_col]
    return {"kind": kind, "job": m.job, "rank": rank, "step": step, "module": module,
            "quantity": quantity,
            "message": f"rank {rank} step {step}: {module} {quantity} " + message,
            "evidence": dict(evidence, module=module, quantity=quantity, level=f.level,
                             steps_over=f.k, window=f.n, noise_rate=f.p, chance=f.chance)}


def _fmt(v: float) -> str:
    return f"{v:.3g}"


# -- the detectors ------------------------------------------------------------------------------

def outliers(table: Any, steps: Iterable[int] | None = None, *,
             job: str | None = None) -> list[Alert]:
    """Values far outside their own recent history (robust z-score of the log; module
    docstring).

    >>> rows = [{"rank": 0, "step": s, "module": m, "grad_norm": (50.0 if m == "b" and s >= 30
    ...          else 1.0) * (1 + 0.05 * ((s * 7 + i) % 5))} for s in range(40)
    ...         for i, m in enumerate("abcd")]
    >>> [(a["module"], a["step"]) for a in outliers(rows)][:1]
    [('b', 33)]
    """
    m = ModuleMatrix.of(table, job)
    _ensure(m)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for q in OWN_QUANTITIES:
            for f in _persistent(m, f"z:{q}", row, ALPHA):
                x = m.values[q][:, f.rank_col, f.module_col]
                base = x[max(0, row - BASELINE):row]
                base = base[np.isfinite(base)]
                med = float(np.median(base)) if base.size else math.nan
                now = float(x[row])
                way = "above" if now > med else "below"
                alerts.append(_alert(
                    m, "numerics_outlier", row, f, q,
                    f"= {_fmt(now)}, {way} its own recent median {_fmt(med)} by {f.level:g}+ "
                    f"robust standard deviations (x{now / med:.3g}) in {f.k} of its last {f.n} "
                    f"steps; other series that far off in {f.p:.1%} of theirs (chance "
                    f"{f.chance:.0e})",
                    {"value": now, "median": med, "ratio": now / med if med else None}))
    return alerts


def layer_ratios(table: Any, steps: Iterable[int] | None = None, *,
                 job: str | None = None) -> list[Alert]:
    """A module's norm moving away from the other modules' (module docstring).

    >>> rows = [{"rank": 0, "step": s, "module": m, "grad_norm": (0.5 ** max(0, s - 20)
    ...          if m == "c" else 1.0)} for s in range(30) for m in "abcd"]
    >>> [(a["module"], a["step"], a["evidence"]["direction"]) for a in layer_ratios(rows)][:1]
    [('c', 25, 'down')]
    """
    m = ModuleMatrix.of(table, job)
    _ensure(m)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for q in LAYER_QUANTITIES:
            for f in _persistent(m, f"r:{q}", row, ALPHA):
                x = _log(m.values[q][[row - LAG, row], f.rank_col])
                d = x[1] - x[0]
                own = float(d[f.module_col])
                med = float(np.nanmedian(np.delete(d, f.module_col)))
                factor = math.exp(own - med)
                then, now = m.values[q][row - LAG, f.rank_col, f.module_col], \
                    m.values[q][row, f.rank_col, f.module_col]
                alerts.append(_alert(
                    m, "numerics_layer_ratio", row, f, q,
                    f"went {_fmt(then)} -> {_fmt(now)} over {LAG} steps (x{math.exp(own):.3g}) "
                    f"while the median other module's went x{math.exp(med):.3g}: its ratio to "
                    f"the other layers moved x{factor:.3g} (over {f.level:g}x in {f.k} of its "
                    f"last {f.n} steps; other modules that far in {f.p:.1%} of theirs, chance "
                    f"{f.chance:.0e})",
                    {"from": float(then), "to": float(now), "lag": LAG,
                     "own_change": math.exp(own), "median_change": math.exp(med),
                     "ratio_change": factor, "direction": "up" if factor > 1 else "down"}))
    return alerts


def large_updates(table: Any, steps: Iterable[int] | None = None, *,
                  job: str | None = None) -> list[Alert]:
    """Optimizer steps that change a weight by a large fraction of itself (module docstring).

    >>> rows = [{"rank": 0, "step": s, "module": m, "update_ratio": 0.4 if m == "a" and s > 20
    ...          else 1e-3} for s in range(30) for m in "abcd"]
    >>> [(a["module"], a["step"], a["evidence"]["level"]) for a in large_updates(rows)][:1]
    [('a', 25, 0.2)]
    """
    m = ModuleMatrix.of(table, job)
    _ensure(m)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for f in _persistent(m, "u:update_ratio", row, ALPHA):
            now = float(m.values["update_ratio"][row, f.rank_col, f.module_col])
            alerts.append(_alert(
                m, "numerics_update", row, f, "update_ratio",
                f"= {_fmt(now)}: the optimizer step changed the weights by {now:.1%} of their "
                f"norm (over {f.level:.0%} in {f.k} of its last {f.n} steps; other modules "
                f"that high in {f.p:.1%} of theirs, chance {f.chance:.0e})",
                {"value": now}))
    return alerts


def nonfinite_modules(table: Any, steps: Iterable[int] | None = None, *,
                      job: str | None = None) -> list[Alert]:
    """NaN/Inf in a module: at the first step of a rank where it appears (the step before was
    clean), naming the first module in execution order (the time of its points) that has it.

    >>> rows = [{"rank": 0, "step": s, "module": m, "time_ns": t, "nonfinite": float(s >= 5
    ...          and m != "embed"), "grad_norm": 1.0} for s in range(8)
    ...         for t, m in enumerate(["embed", "layer.0", "layer.1"])]
    >>> [(a["module"], a["step"]) for a in nonfinite_modules(rows)]
    [('layer.0', 5)]
    """
    m = ModuleMatrix.of(table, job)
    bad = np.nan_to_num(m.values["nonfinite"], nan=0.0) != 0
    for q in OWN_QUANTITIES:
        bad |= np.isinf(m.values[q])                    # a norm that overflowed
    any_bad = bad.any(axis=2)                                       # [steps, ranks]
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for rc in np.flatnonzero(any_bad[row]):
            if row > 0 and any_bad[row - 1, rc]:
                continue
            cols = np.flatnonzero(bad[row, rc])
            t = m.times[row, rc, cols]
            first = int(cols[np.lexsort((cols, np.where(t > 0, t, np.iinfo(np.int64).max)))[0]])
            module = m.modules[first]
            rank, step = int(m.ranks[rc]), int(m.steps[row])
            what = {q: float(m.values[q][row, rc, first]) for q in QUANTITIES
                    if not np.isnan(m.values[q][row, rc, first]) or q != "update_ratio"}
            count = what.get("nonfinite")
            names = [m.modules[c] for c in cols]
            alerts.append({
                "kind": "numerics_nonfinite", "job": m.job, "rank": rank, "step": step,
                "module": module, "quantity": "nonfinite",
                "message": (f"rank {rank} step {step}: NaN/Inf first in {module} (in execution "
                            f"order)" + (f", {count:.0f} non-finite values" if count else "")
                            + (f"; {len(names)} modules have some" if len(names) > 1 else "")),
                "evidence": {"module": module, "quantity": "nonfinite", "values": what,
                             "modules": names[:32], "count": len(names)}})
    return alerts


def across_ranks(alerts: list[Alert]) -> list[Alert]:
    """One alert per kind, step, module and quantity: the lowest rank's, naming every rank
    where it was found (data-parallel ranks hold the same weights and gradients: a layer that
    diverges does so on all of them, and is one cause, not one per rank).

    >>> a = {"kind": "numerics_update", "job": "j", "rank": 3, "step": 9, "module": "fc",
    ...      "quantity": "update_ratio", "message": "rank 3 step 9: fc ...", "evidence": {}}
    >>> b = dict(a, rank=1, message="rank 1 step 9: fc ...")
    >>> [(x["rank"], x["evidence"]["ranks"], x["message"]) for x in across_ranks([a, b])]
    [(1, [1, 3], 'rank 1 step 9: fc ... [on 2 ranks: 1,3]')]
    """
    groups: dict[tuple, list[Alert]] = {}
    for a in alerts:
        groups.setdefault((a["kind"], a["step"], a["module"], a["quantity"]), []).append(a)
    out = []
    for group in groups.values():
        group.sort(key=lambda a: a["rank"])
        first = group[0]
        ranks = [a["rank"] for a in group]
        if len(ranks) > 1:
            shown = ",".join(map(str, ranks[:16])) + (",..." if len(ranks) > 16 else "")
            first = dict(first, message=f"{first['message']} [on {len(ranks)} ranks: {shown}]")
        first["evidence"] = dict(first.get("evidence") or {}, ranks=ranks[:64],
                                 rank_count=len(ranks))
        out.append(first)
    return out


def detect(table: Any, steps: Iterable[int] | None = None, *,
           job: str | None = None) -> list[Alert]:
    """Every numerics detector over one matrix, one alert per cause found on several ranks
    (:func:`across_ranks`)."""
    m = ModuleMatrix.of(table, job)
    steps = None if steps is None else list(steps)
    return across_ranks(nonfinite_modules(m, steps, job=job) + outliers(m, steps, job=job)
                        + layer_ratios(m, steps, job=job) + large_updates(m, steps, job=job))
