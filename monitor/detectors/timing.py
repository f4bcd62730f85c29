"""Timing detectors: stragglers (a rank slower than its peers) and slow steps (the job slower
than its own history). See :mod:`probe.monitor.detectors.step_detectors` for the rules they share.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from probe.monitor.detectors.noise_model import (ALPHA, HISTORY, LEVELS, WINDOWS, Verdict,
                                                 level_bins, persistent, row_median)
from probe.monitor.detectors.step_matrix import Alert, StepMatrix
from probe.monitor.detectors.step_series import (JOB_SERIES, capped_excess, clock_excess, derive,
                                                 turn_medians)

#: A straggler must cost: its own work at least this much above its peers' median on average
#: over the window (each step's excess capped at 100%, so one hiccup is one slow step). Less is
#: within what shared machines do to a healthy rank (a neighbour's bursts, a slower core) and
#: not worth an alert at 10,000 ranks; the smallest straggler the issue names, 1.2x, costs 20%.
#: (The lowest level, 1.1x, is where the evidence for such a rank is counted.)
MIN_EXCESS = 0.15
#: Levels the job's step time is tested at, as ratios to its own recent median: below 1.2x a
#: job-wide change is within what load on shared machines does to a job from minute to minute.
JOB_LEVELS = (1.2, 1.35, 1.5, 2.0, 3.0)
#: The windows of the job-wide series (one series, not one per rank: fewer lengths suffice).
JOB_WINDOWS = (5, 10, 20, 50)
#: The job-wide baseline: the median of at most this many steps before the window judged...
BASELINE = 50
#: ...and of at least this many.
MIN_BASELINE = 10
#: A phase must have grown, and the job's step with it, by at least this fraction of the
#: step's median (a 1 ms phase tripled is no slowdown; a phase that grew while the step did not
#: is no slower job).
PHASE_MIN_COST = 0.05


# -- straggler ---------------------------------------------------------------------------------

def stragglers(table: Any, steps: Iterable[int] | None = None, *,
               job: str | None = None) -> list[Alert]:
    """Ranks slower than their peers, persistently (module docstring, rules 1-4).

    At each judged step a rank is tested on its own work (compute + data loading) against the
    median of the other ranks; a rank not found so is tested on its whole step time, and is a
    communication straggler when more than half of its excess is communication time. The
    cause of an own-work straggler is the phase (compute or data loading) whose excess over
    the peers' median is larger, over the steps where it stood out.
    """
    m = StepMatrix.of(table, job)
    d = derive(m)
    job = job if job is not None else m.job
    if len(m.ranks) < 2:
        return []
    alpha = ALPHA / len(m.ranks)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        own = _costly(persistent(d["own_bins"], row, LEVELS, cum=d["own_cum"], alpha=alpha),
                      d["x_own"], row, d["own_turn"])
        by_step = {c: v for c, v in _costly(persistent(d["step_bins"], row, LEVELS,
                                                       cum=d["step_cum"], alpha=alpha),
                                            d["x_step"], row).items() if c not in own}
        for col, v in sorted(own.items()):
            cause, excess = _own_cause(m, col, v.hits)
            alerts.append(_straggler_alert(m, job, row, col, v, cause, d["x_own"], excess))
        for col, v in sorted(by_step.items()):
            comm = _excess(m, "comm_time_ms", col, v.hits)
            step = _excess(m, "step_time_ms", col, v.hits)
            if comm is not None and step is not None and comm > 0.5 * step:
                alerts.append(_straggler_alert(m, job, row, col, v, "communication", d["x_step"],
                                               {"communication": comm, "step": step}))
    return alerts


def _costly(found: dict[int, Verdict], x: np.ndarray, row: int,
            medians: np.ndarray | None = None) -> dict[int, Verdict]:
    """The verdicts whose rank cost the job at least :data:`MIN_EXCESS` over their window, and
    more than the other ranks' own turns at running slow (:func:`turns`, ``medians`` its
    per-row medians where derived): the mean excess over the peers' median, each step's capped
    at 100% (a lone 10x hiccup is one slow step, not a slow rank)."""
    out, seen = {}, None
    for col, v in found.items():
        e = capped_excess(x[v.first:row + 1, col])
        e = e[e > -np.inf]                       # the steps judged
        if not (e.size and e.mean() >= MIN_EXCESS):
            continue
        seen = turns(x, row, medians=medians) if seen is None else seen
        others = np.delete(seen, col)
        if others.size >= 10:                   # the noisiest tenth aside, as in the noise rates
            others = np.sort(others)[:others.size - others.size // 10]
        if not others.size or e.mean() > others.max():
            out[col] = v
    return out


def turns(x: np.ndarray, row: int, w: int = WINDOWS[0], medians: np.ndarray | None = None
          ) -> np.ndarray:
    """Per rank, the deepest turn it took at running slower than its peers in the last
    :data:`HISTORY` steps up to ``row``: the largest median excess (capped, as in
    :func:`_costly`) over ``w`` consecutive steps; -inf without a whole window.

    Ranks sharing a loaded machine take turns at running 1.2-1.3x their peers for a dozen
    steps while a neighbour holds their core; a rank that runs 1.2x now is no straggler in such
    a job, but is in one whose ranks stay within 5% of each other. A median, so a lone hiccup
    is no turn (a rank slow in a random third of its steps is still found: its mean excess
    is compared, not its median). A rank slower than its peers over most of those steps (its
    median excess :data:`MIN_EXCESS` or more) is a straggler, not taking turns: -inf.

    ``medians``: each row's median over the ``w`` rows ending there (``turn_medians`` of ``x``,
    the derived ``own_turn``), so a judged step reads them instead of taking a median over
    every window of its history (1,024 ranks: ~5 ms a judged step).

    >>> x = np.zeros((40, 4)); x[5:15, 0] = np.log(1.3); x[20, 1] = np.log(5.0); x[:, 3] = 1.0
    >>> turns(x, 39).round(2).tolist()
    [0.3, 0.0, 0.0, -inf]
    """
    lo = max(0, row - HISTORY + 1)
    n = row + 1 - lo
    if n < w:
        return np.full(x.shape[1], -np.inf)
    medians = turn_medians(x[lo:row + 1], n, w) if medians is None else medians[lo:row + 1]
    whole = medians[w - 1:]                         # the windows inside the history
    deepest = np.where(np.isnan(whole), -np.inf, whole).max(axis=0)
    # the median of the history (its middle element, the upper one of an even count) is at
    # least MIN_EXCESS exactly when at most n // 2 of its steps are below it
    typical_high = (capped_excess(x[lo:row + 1]) >= MIN_EXCESS).sum(axis=0) >= n - n // 2
    return np.where(typical_high, -np.inf, deepest)


def _excess(m: StepMatrix, name: str, col: int, rows: np.ndarray) -> float | None:
    """Median over ``rows`` of the rank's ``name`` minus the other ranks' median (ms)."""
    values = m.col(name)[rows]
    traced = m.cols.get("traced")
    if traced is not None:          # the judged rows' cells only, not the whole window's
        values = np.where(np.nan_to_num(traced[rows], nan=0.0) > 0, np.nan, values)
    if rows.size == 0 or np.isnan(values[:, col]).all():
        return None
    d = values[:, col] - row_median(np.delete(values, col, axis=1))
    d = d[~np.isnan(d)]
    return float(np.median(d)) if d.size else None


def _own_cause(m: StepMatrix, col: int, rows: np.ndarray) -> tuple[str, dict[str, float]]:
    excess = {}
    for cause, key in (("compute", "compute_time_ms"), ("data loading", "data_time_ms")):
        e = _excess(m, key, col, rows)
        if e is not None:
            excess[cause] = e
    return (max(excess, key=excess.get) if excess else "compute"), excess


def _straggler_alert(m: StepMatrix, job: str | None, row: int, col: int, v: Verdict,
                     cause: str, series: np.ndarray, excess: dict[str, float]) -> Alert:
    rank, step = int(m.ranks[col]), int(m.steps[row])
    ratio = float(np.exp(np.median(series[v.hits, col])))
    what = "step time" if cause == "communication" else "own work (compute + data)"
    clocks = _clock_ratios(m, col, v.hits) if cause != "communication" else None
    return {
        "kind": "straggler", "job": job, "rank": rank, "step": step,
        "message": (f"rank {rank} is a straggler ({cause}): its {what} is {ratio:.2f}x its "
                    f"peers' median"
                    + (f" (wall clock {clocks[0]:.2f}x, CPU clock {clocks[1]:.2f}x: more work "
                       "or a slower processor, not a busy core)" if clocks else "")
                    + f", above {v.level:g}x in {v.k} of its last {v.n} steps; the "
                    f"other ranks are above {v.level:g}x in {v.p:.1%} of theirs (chance "
                    f"{v.chance:.0e})"),
        "evidence": {"cause": cause, "ratio": ratio, "level": v.level, "k": v.k, "n": v.n,
                     "noise_rate": v.p, "run_rate": v.p11, "chance": v.chance,
                     "excess_ms": excess,
                     **({"wall_ratio": clocks[0], "cpu_ratio": clocks[1]} if clocks else {}),
                     "outlier_steps": [int(m.steps[i]) for i in v.hits],
                     "ranks_at_step": int((~np.isnan(series[row])).sum())},
    }


def _clock_ratios(m: StepMatrix, col: int, rows: np.ndarray) -> tuple[float, float] | None:
    """The rank's own work over its peers' median on the wall clock and on the CPU clock
    (medians over ``rows``), where the ranks reported their compute's CPU time; else None."""
    if "compute_cpu_ms" not in m.cols or rows.size == 0:
        return None
    wall, on_cpu = clock_excess(m.take(rows))
    if on_cpu is None or np.isnan(wall[:, col]).all() or np.isnan(on_cpu[:, col]).all():
        return None
    return (float(np.exp(np.nanmedian(wall[:, col]))),
            float(np.exp(np.nanmedian(on_cpu[:, col]))))


# -- slow steps (job-wide) ---------------------------------------------------------------------

def _nanmedian(v: np.ndarray) -> float:
    v = v[~np.isnan(v)]
    return float(np.median(v)) if v.size else math.nan


def slow_steps(table: Any, steps: Iterable[int] | None = None, *,
               job: str | None = None) -> list[Alert]:
    """The job's steps became persistently slower than its own recent history.

    At each judged step and window ``n``, the baseline is the median over the :data:`BASELINE`
    steps before the window. Four series are tested against their baseline (rules 3 and 4,
    the noise being how often the baseline's own steps exceed it), each as the step time the
    job would have if only it had changed: the step time itself (median over ranks), and its
    phases: compute and data loading (medians over ranks) and transfers (the least
    communication time of any rank). A phase tells more than the whole step: in a synchronous
    job the step waits for the slowest rank's hiccups, so its own noise is high, while a slower
    link shows in every step's transfers. When the step time grew mostly by waiting, a
    straggler slowed the job: it has its own alert, and none is raised here. ``rank`` is None:
    the whole job is slower.

    >>> rows = [{"rank": r, "step": s, "step_time_ms": 100.0 * (2 if s >= 40 else 1) + s % 3,
    ...          "compute_time_ms": 80.0 * (2 if s >= 40 else 1)} for s in range(50) for r in range(2)]
    >>> [(a["step"], a["evidence"]["phase"]) for a in slow_steps(rows)][:1]
    [(47, 'compute')]
    """
    m = StepMatrix.of(table, job)
    js = derive(m)["job"]
    job = job if job is not None else m.job
    step = js[:, 0]
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        if np.isnan(step[row]):
            continue
        best: tuple[Verdict, float, int, str, bool] | None = None
        names = ("step", "compute", "data loading", "communication", "compute",
                 "data loading", "communication")
        for w in JOB_WINDOWS:
            lo = row - w + 1
            first = max(0, lo - BASELINE)
            ref = _nanmedian(step[first:max(0, lo)])
            if lo < 0 or (~np.isnan(step[first:lo])).sum() < MIN_BASELINE or not ref > 0:
                continue
            # each series as the step time the job would have if only it had changed, and each
            # phase on its own scale (a link 3x slower is news even where transfers are a tenth
            # of the step: its own noise is small), when it costs the step PHASE_MIN_COST
            phases = js[first:row + 1, :4]
            base = row_median(phases[:lo - first].T)
            series = np.empty((len(phases), 7))
            series[:, :4] = phases
            series[:, 1:4] = ref + (phases[:, 1:] - base[None, 1:])
            with np.errstate(all="ignore"):
                series[:, 4:] = ref * phases[:, 1:] / np.where(base[1:] > 0, base[1:], np.nan)
                bins = level_bins(np.log(np.maximum(series, 1e-12) / ref), JOB_LEVELS)
            noise = bins.copy()
            noise[-w:] = -1                              # the window is judged, not noise
            for col, v in persistent(bins, len(bins) - 1, JOB_LEVELS, leave_out=False,
                                     history=len(bins), noise=noise, windows=(w,)).items():
                if col:
                    # a phase's growth must show in the step (compute that grew while the
                    # waiting shrank is the ranks' noise moving about, not a slower job)
                    phase = (col - 1) % 3 + 1
                    cost = _nanmedian(phases[-w:, phase] - base[phase])
                    slower = _nanmedian(phases[-w:, 0]) - ref
                    if not min(cost, slower) >= PHASE_MIN_COST * ref:
                        continue
                if best is None or v.chance < best[0].chance:
                    v.hits = v.hits + first
                    best = (v, ref, lo, names[col], col >= 4)
        if best is None:
            continue
        v, ref, lo, series_name, own_scale = best
        window, before = slice(lo, row + 1), slice(max(0, lo - BASELINE), lo)
        growth = {name: _nanmedian(js[window, i]) - _nanmedian(js[before, i])
                  for i, name in enumerate(JOB_SERIES) if i}
        waiting = growth.pop("comm_all") - growth["communication"]
        growth = {k: g for k, g in growth.items() if not math.isnan(g)}
        if series_name == "step" and not math.isnan(waiting) and growth \
                and waiting > max(growth.values()):
            continue                                     # a straggler's doing: see stragglers()
        phase = (series_name if series_name != "step" else
                 max(growth, key=growth.get) if growth else None)
        now = _nanmedian(step[window])
        alerts.append({
            "kind": "slow_step", "job": job, "rank": None, "step": int(m.steps[row]),
            "message": (f"the job's steps are slower: {now:.1f} ms, {now / ref:.2f}x its "
                        f"median of {ref:.1f} ms before"
                        + (f", {phase} {growth.get(phase, math.nan):+.1f} ms" if phase else "")
                        + (f" ({phase} {_phase_ratio(js, names.index(phase), window, before):.2f}x "
                           "its own median)" if own_scale else "")
                        + f"; {'that phase ' if own_scale else ''}above {v.level:g}x in {v.k} "
                        f"of the last {v.n} steps, chance {v.chance:.0e} by its own noise"),
            "evidence": {"step_time_ms": now, "median_ms": ref, "ratio": now / ref,
                         "level": v.level, "k": v.k, "n": v.n, "noise_rate": v.p,
                         "run_rate": v.p11, "chance": v.chance, "phase": phase,
                         "series": series_name, "own_scale": own_scale,
                         "growth_ms": dict(growth, waiting=waiting),
                         "slow_steps": [int(m.steps[i]) for i in v.hits]},
        })
    return alerts


def _phase_ratio(js: np.ndarray, col: int, window: slice, before: slice) -> float:
    """The median of job series ``col`` over ``window`` over its median ``before``."""
    was = _nanmedian(js[before, col])
    return _nanmedian(js[window, col]) / was if was > 0 else math.nan
