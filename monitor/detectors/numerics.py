"""Numerics detectors: pure functions over the per-module series of ``numerics:*`` points.

The input is a :class:`ModuleMatrix`: for each quantity of :mod:`probe.monitor.numerics_names` an
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

The first three judge like the timing detectors (:mod:`probe.monitor.detectors.step_detectors`,
rules 3 and 4): the noise is measured on the job (how often the series of the *other* modules, on
every rank, exceed each level over the last :data:`HISTORY` steps, and how often an excess runs on
into the next step; the same module on another rank is no witness: data-parallel ranks hold the same
weights) and an alert needs the excess in ``k`` of the last ``n`` steps (``n`` in :data:`WINDOWS`,
``k`` at least 3), with ``k`` so many that its chance under that noise is below
:data:`~probe.monitor.detectors.noise_model.ALPHA` shared by the series judged. A series is judged
once it has :data:`MIN_BASELINE` earlier steps: the first steps of a run (Adam's warm-up moves
everything) are history only.

The detectors' per-step work is cached in ``ModuleMatrix.derived`` (the level bins of each
test, and their sums over the series); the service's rolling window
(:class:`probe.monitor.detectors.numerics_window.NumericsWindow`) computes them once per new step.

>>> rows = [{"rank": 0, "step": s, "module": m, "weight_norm": 10.0 * (1.25 ** max(0, s - 20)
...          if m == "l3" else 1.0 + 0.001 * s)} for s in range(40) for m in ("l0", "l1", "l2", "l3")]
>>> [(a["kind"], a["module"], a["quantity"], a["step"]) for a in detect(rows)][:1]
[('numerics_outlier', 'l3', 'weight_norm', 27)]
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from probe.monitor.detectors.module_matrix import ModuleMatrix
from probe.monitor.detectors.noise_model import ALPHA
from probe.monitor.detectors.numerics_evidence import (BASELINE, HISTORY, LAG, LAYER_QUANTITIES,
                                                       MIN_BASELINE, MIN_MODULES, OWN_QUANTITIES,
                                                       RATIO_LEVELS, UPDATE_LEVELS, WINDOWS,
                                                       Z_FLOOR, Z_LEVELS, Alert, derive,
                                                       ensure_derived, fmt, log_values, make_alert,
                                                       persistent_findings)
from probe.monitor.numerics_names import QUANTITIES

__all__ = ["BASELINE", "HISTORY", "LAG", "LAYER_QUANTITIES", "MIN_BASELINE", "MIN_MODULES",
           "OWN_QUANTITIES", "RATIO_LEVELS", "UPDATE_LEVELS", "WINDOWS", "Z_FLOOR", "Z_LEVELS",
           "ModuleMatrix", "across_ranks", "derive", "detect", "large_updates", "layer_ratios",
           "nonfinite_modules", "outliers"]

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
    ensure_derived(m)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for q in OWN_QUANTITIES:
            for f in persistent_findings(m, f"z:{q}", row, ALPHA):
                x = m.values[q][:, f.rank_col, f.module_col]
                base = x[max(0, row - BASELINE):row]
                base = base[np.isfinite(base)]
                med = float(np.median(base)) if base.size else math.nan
                now = float(x[row])
                way = "above" if now > med else "below"
                alerts.append(make_alert(
                    m, "numerics_outlier", row, f, q,
                    f"= {fmt(now)}, {way} its own recent median {fmt(med)} by {f.level:g}+ "
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
    ensure_derived(m)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for q in LAYER_QUANTITIES:
            for f in persistent_findings(m, f"r:{q}", row, ALPHA):
                x = log_values(m.values[q][[row - LAG, row], f.rank_col])
                d = x[1] - x[0]
                own = float(d[f.module_col])
                med = float(np.nanmedian(np.delete(d, f.module_col)))
                factor = math.exp(own - med)
                then, now = m.values[q][row - LAG, f.rank_col, f.module_col], \
                    m.values[q][row, f.rank_col, f.module_col]
                alerts.append(make_alert(
                    m, "numerics_layer_ratio", row, f, q,
                    f"went {fmt(then)} -> {fmt(now)} over {LAG} steps (x{math.exp(own):.3g}) "
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
    ensure_derived(m)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for f in persistent_findings(m, "u:update_ratio", row, ALPHA):
            now = float(m.values["update_ratio"][row, f.rank_col, f.module_col])
            alerts.append(make_alert(
                m, "numerics_update", row, f, "update_ratio",
                f"= {fmt(now)}: the optimizer step changed the weights by {now:.1%} of their "
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

