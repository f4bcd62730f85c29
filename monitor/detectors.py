"""Detectors: pure functions over a per-(rank, step) table that return alerts with evidence.

The input is the table :meth:`monitor.storage.MonitorStore.step_table` returns (any Arrow
table or list of dicts with ``rank``, ``step`` and some of ``step_time_ms``,
``compute_time_ms``, ``comm_time_ms``, ``data_time_ms``, ``loss``, ``grad_norm``,
``nonfinite_grads``). Each detector looks at the steps in ``steps`` (all when ``None``) and uses
the rest of the table as history. An alert is a dict: ``kind``, ``job``, ``rank``, ``step``,
``message`` and ``evidence`` (the numbers behind the verdict).

- :func:`slow_steps`: a step much slower than the same rank's recent history; robust
  statistics (median and MAD of the previous ``window`` steps), not a fixed threshold.
- :func:`stragglers`: a rank slower than its peers at the same steps, for ``persist`` of the
  last ``window`` steps, naming the cause: ``compute``, ``data loading`` or ``communication``.
  In a synchronous data-parallel step every rank waits in the gradient all-reduce for the
  slowest one, so step times are equal and the waiting shows as *communication* time on the
  healthy ranks; the straggler is the rank whose own work (compute + data loading) stands out.
- :func:`nonfinite`: NaN/Inf in the loss or the gradients.

A step a rank ran under a deep trace or while sending its files (``traced`` > 0, set by the
agent) carries the trace's own cost: it is neither judged nor used as history or as a peer by
the timing detectors, so asking for a trace never makes the traced ranks look like stragglers or
slow steps. Nor does it
make their peers look like ones: the profiler starts before the first traced step and writes
its trace after the last, outside the measured steps, and the other ranks wait for it in their
next collective. So the straggler detector judges a step at which some rank ran traced, or the
step after one, on own work only (no "communication" verdict, which waiting would fake) and only
with at least three untraced ranks there (a median over one peer is no median), and the slow
step detector does not judge those steps at all.

>>> rows = [{"rank": r, "step": s, "step_time_ms": 10.0, "compute_time_ms": 30.0 if r == 2 else 8.0,
...          "data_time_ms": 1.0, "comm_time_ms": 1.0} for s in range(6) for r in range(4)]
>>> [(a["kind"], a["rank"], a["evidence"]["cause"]) for a in stragglers(rows, steps=[5])]
[('straggler', 2, 'compute')]
"""

from __future__ import annotations

import math
from statistics import median
from typing import Any, Iterable, Mapping, Sequence

Alert = dict[str, Any]

#: MAD to standard deviation for normal data.
MAD_SCALE = 1.4826
#: Deviations between ranks are measured in units of at least this fraction of the step time.
STEP_FLOOR = 0.05


def _rows(table: Any) -> list[Mapping[str, Any]]:
    if hasattr(table, "to_pylist"):
        return table.to_pylist()
    return list(table)


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _robust(values: Sequence[float], floor_rel: float, floor_abs: float) -> tuple[float, float, float]:
    """(median, MAD, scale) where scale = max(1.4826 MAD, floor_rel * |median|, floor_abs)."""
    med = median(values)
    mad = median(abs(v - med) for v in values)
    return med, mad, max(MAD_SCALE * mad, floor_rel * abs(med), floor_abs)


def _is_traced(row: Mapping[str, Any]) -> bool:
    """The row's timings carry a deep trace's cost (set by the agent)."""
    return (_num(row, "traced") or 0.0) > 0.0


def _untraced(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows whose timings are the training's own (not a step run under a deep trace)."""
    return [r for r in rows if not _is_traced(r)]


def _near_traces(rows: Sequence[Mapping[str, Any]]) -> set[int]:
    """Steps at which some rank ran under a deep trace, and the step after each: the other
    ranks wait there for the traced ranks' profiler to start and to write its trace."""
    traced = {int(r["step"]) for r in rows if _is_traced(r)}
    return traced | {s + 1 for s in traced}


def _by_rank(rows: Iterable[Mapping[str, Any]]) -> dict[int, dict[int, Mapping[str, Any]]]:
    out: dict[int, dict[int, Mapping[str, Any]]] = {}
    for row in rows:
        out.setdefault(int(row["rank"]), {})[int(row["step"])] = row
    return out


def slow_steps(table: Any, steps: Iterable[int] | None = None, *, job: str | None = None,
               window: int = 20, min_history: int = 5, k: float = 6.0,
               min_ratio: float = 1.5) -> list[Alert]:
    """Steps whose ``step_time_ms`` is far above the rank's own recent history.

    A step is slow when ``(t - median) / scale > k``, ``t > min_ratio * median`` and ``t`` is
    10% above the 90th percentile of the history (so a bimodal rhythm is not "slow"), with
    median and MAD over the rank's previous ``window`` steps (at least ``min_history`` of them)
    and scale floored at 5% of the median. The evidence names the phase that grew the most.

    >>> rows = [{"rank": 0, "step": s, "step_time_ms": 100.0 + (s % 3)} for s in range(10)]
    >>> rows.append({"rank": 0, "step": 10, "step_time_ms": 400.0})
    >>> [(a["rank"], a["step"]) for a in slow_steps(rows)]
    [(0, 10)]
    """
    all_rows = _rows(table)
    disturbed = _near_traces(all_rows)
    wanted = None if steps is None else set(int(s) for s in steps)
    alerts: list[Alert] = []
    for rank, per_step in sorted(_by_rank(_untraced(all_rows)).items()):
        ordered = sorted(per_step)
        for i, step in enumerate(ordered):
            if (wanted is not None and step not in wanted) or step in disturbed:
                continue
            t = _num(per_step[step], "step_time_ms")
            if t is None:
                continue
            prev = [per_step[s] for s in ordered[max(0, i - window):i] if s >= step - window]
            hist = [v for v in (_num(r, "step_time_ms") for r in prev) if v is not None]
            if len(hist) < min_history:
                continue
            med, mad, scale = _robust(hist, 0.05, 1e-6)
            z = (t - med) / scale
            p90 = sorted(hist)[int(0.9 * (len(hist) - 1))]
            if z <= k or t <= min_ratio * med or t <= 1.1 * p90:
                continue
            growth = {}
            for phase, key in (("compute", "compute_time_ms"), ("communication", "comm_time_ms"),
                               ("data loading", "data_time_ms")):
                now = _num(per_step[step], key)
                past = [v for v in (_num(r, key) for r in prev) if v is not None]
                if now is not None and past:
                    growth[phase] = now - median(past)
            phase = max(growth, key=growth.get) if growth else None
            alerts.append({
                "kind": "slow_step", "job": job if job is not None else per_step[step].get("job"),
                "rank": rank, "step": step,
                "message": f"rank {rank} step {step} took {t:.1f} ms, {t / med:.1f}x its recent "
                           f"median {med:.1f} ms" + (f" (most growth in {phase})" if phase else ""),
                "evidence": {"step_time_ms": t, "median_ms": med, "mad_ms": mad, "z": z,
                             "ratio": t / med if med else math.inf, "history_steps": len(hist),
                             "phase": phase, "growth_ms": growth},
            })
    return alerts


def _busy(row: Mapping[str, Any]) -> float | None:
    """The rank's own work in a step: compute + data loading (or step time minus communication)."""
    compute, data = _num(row, "compute_time_ms"), _num(row, "data_time_ms")
    if compute is not None or data is not None:
        return (compute or 0.0) + (data or 0.0)
    total, comm = _num(row, "step_time_ms"), _num(row, "comm_time_ms")
    if total is None:
        return None
    return total - (comm or 0.0)


def _outliers_at(rows_at_step: Sequence[Mapping[str, Any]], k: float, min_ratio: float,
                 disturbed: bool = False) -> dict[int, dict[str, Any]]:
    """Ranks that stand out from their peers at one step, with the cause and the numbers
    (``disturbed``: a step next to another rank's deep trace, judged on own work only)."""
    found: dict[int, dict[str, Any]] = {}
    if len(rows_at_step) < 2:
        return found
    totals = [v for v in (_num(r, "step_time_ms") for r in rows_at_step) if v is not None]
    # A difference must matter at the scale of the whole step, not only of a small phase.
    floor = max(0.05, STEP_FLOOR * median(totals)) if totals else 0.05

    def compare(key_fn, rank_row) -> tuple[float, float, float] | None:
        mine = key_fn(rank_row)
        peers = [v for v in (key_fn(r) for r in rows_at_step if r is not rank_row) if v is not None]
        if mine is None or not peers:
            return None
        med, _, scale = _robust(peers, 0.05, floor)
        return mine, med, (mine - med) / scale

    for row in rows_at_step:
        c = compare(_busy, row)
        if c is None:
            continue
        mine, med, z = c
        if z > k and mine > min_ratio * med:
            excess = {}
            for cause, key in (("compute", "compute_time_ms"), ("data loading", "data_time_ms")):
                cc = compare(lambda r, key=key: _num(r, key), row)
                if cc is not None:
                    excess[cause] = cc[0] - cc[1]
            cause = max(excess, key=excess.get) if excess else "compute"
            found[int(row["rank"])] = {"cause": cause, "value_ms": mine, "peer_median_ms": med,
                                       "z": z, "excess_ms": excess}
    if found or disturbed:
        return found
    # No rank stands out in its own work. A rank whose whole step still stands out spent the
    # extra time communicating. (A rank that merely *waits* longer in a collective does not:
    # in a synchronous step everyone's step time is the same.)
    for row in rows_at_step:
        c = compare(lambda r: _num(r, "step_time_ms"), row)
        if c is None:
            continue
        mine, med, z = c
        comm = compare(lambda r: _num(r, "comm_time_ms"), row)
        if z > k and mine > min_ratio * med and comm is not None and comm[0] - comm[1] > 0.5 * (mine - med):
            found[int(row["rank"])] = {"cause": "communication", "value_ms": comm[0],
                                       "peer_median_ms": comm[1], "z": z, "excess_ms":
                                       {"communication": comm[0] - comm[1], "step": mine - med}}
    return found


def stragglers(table: Any, steps: Iterable[int] | None = None, *, job: str | None = None,
               k: float = 4.0, min_ratio: float = 1.2, window: int = 5,
               persist: int = 3) -> list[Alert]:
    """Ranks slower than their peers at the same steps, in ``persist`` of the last ``window``.

    At each step a rank is an outlier when its own work (compute + data loading) exceeds the
    median of the *other* ranks by ``k`` robust deviations (MAD, floored at 5% of the peers'
    value and at 5% of the step time) and by ``min_ratio``; if no rank
    stands out in its own work, a rank whose whole step stands out, by more than half in
    communication time, is one (cause ``communication``; a rank that only waits longer in a
    synchronous collective is a victim, not a straggler). An alert is raised at a step in ``steps`` for a rank that was an
    outlier at that step and in at least ``persist`` of the last ``window`` judged steps. Steps
    at or right after another rank's deep trace are judged on own work only, and only with three
    untraced ranks at least (else they are left out of the window).
    """
    all_rows = _rows(table)
    disturbed = _near_traces(all_rows)
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for row in _untraced(all_rows):
        by_step.setdefault(int(row["step"]), []).append(row)
    # the window counts judged steps: a step too close to a trace to judge is no evidence either way
    ordered = [s for s in sorted(by_step) if len(by_step[s]) >= (3 if s in disturbed else 2)]
    outliers = {s: _outliers_at(by_step[s], k, min_ratio, s in disturbed) for s in ordered}
    wanted = None if steps is None else set(int(s) for s in steps)
    alerts: list[Alert] = []
    for i, step in enumerate(ordered):
        if wanted is not None and step not in wanted:
            continue
        recent = ordered[max(0, i - window + 1):i + 1]
        for rank, info in sorted(outliers[step].items()):
            hits = [s for s in recent if rank in outliers[s]]
            if len(hits) < persist:
                continue
            causes = [outliers[s][rank]["cause"] for s in hits]
            cause = info["cause"]
            if causes.count(cause) < max(causes.count(c) for c in causes):
                cause = max(set(causes), key=causes.count)
            ratio = info["value_ms"] / info["peer_median_ms"] if info["peer_median_ms"] else math.inf
            what = "communication time" if cause == "communication" else "own work (compute + data)"
            alerts.append({
                "kind": "straggler", "rank": rank, "step": step,
                "job": job if job is not None else by_step[step][0].get("job"),
                "message": f"rank {rank} is a straggler ({cause}): its {what} is "
                           f"{info['value_ms']:.1f} ms vs a peer median of "
                           f"{info['peer_median_ms']:.1f} ms ({ratio:.1f}x) in {len(hits)} of "
                           f"the last {len(recent)} steps",
                "evidence": {"cause": cause, "value_ms": info["value_ms"],
                             "peer_median_ms": info["peer_median_ms"], "ratio": ratio,
                             "z": info["z"], "excess_ms": info["excess_ms"],
                             "outlier_steps": hits, "ranks_at_step": len(by_step[step])},
            })
    return alerts


def nonfinite(table: Any, steps: Iterable[int] | None = None, *,
              job: str | None = None) -> list[Alert]:
    """NaN/Inf in the loss or the gradients (``nonfinite_grads`` > 0 or a non-finite grad norm).

    >>> [a["step"] for a in nonfinite([{"rank": 0, "step": 3, "loss": float("nan")}])]
    [3]
    """
    wanted = None if steps is None else set(int(s) for s in steps)
    alerts: list[Alert] = []
    for row in _rows(table):
        if wanted is not None and int(row["step"]) not in wanted:
            continue
        loss, gnorm, bad = row.get("loss"), row.get("grad_norm"), row.get("nonfinite_grads")
        where = []
        if loss is not None and not math.isfinite(loss):
            where.append(f"loss = {loss}")
        if bad is not None and math.isfinite(bad) and bad > 0:
            where.append(f"{int(bad)} non-finite gradient values")
        elif bad is not None and not math.isfinite(bad):
            where.append("non-finite gradient count")
        if gnorm is not None and not math.isfinite(gnorm):
            where.append(f"grad norm = {gnorm}")
        if where:
            rank, step = int(row["rank"]), int(row["step"])
            alerts.append({"kind": "nonfinite", "rank": rank, "step": step,
                           "job": job if job is not None else row.get("job"),
                           "message": f"rank {rank} step {step}: " + ", ".join(where),
                           "evidence": {"loss": loss, "grad_norm": gnorm, "nonfinite_grads": bad}})
    return alerts


def detect(table: Any, steps: Iterable[int] | None = None, *, job: str | None = None) -> list[Alert]:
    """All detectors over one table: non-finite values, stragglers, slow steps."""
    rows = _rows(table)
    steps = None if steps is None else list(steps)
    return (nonfinite(rows, steps, job=job) + stragglers(rows, steps, job=job)
            + slow_steps(rows, steps, job=job))
