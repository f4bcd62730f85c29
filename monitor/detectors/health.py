"""Health detectors: memory that keeps growing on a rank, NaN/Inf in the loss or gradients."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from probe.monitor.detectors.noise_model import ALPHA, persistent
from probe.monitor.detectors.step_matrix import CHECKED_COLUMNS, MEMORY_COLUMNS, Alert, StepMatrix
from probe.monitor.detectors.step_series import derive

#: A memory rise smaller than this fraction of the level over the window is allocator jitter.
MEM_MIN_GROWTH = 0.01


# -- memory ------------------------------------------------------------------------------------

def memory_growth(table: Any, steps: Iterable[int] | None = None, *,
                  job: str | None = None) -> list[Alert]:
    """Ranks whose memory (``device_mem_mb``, else ``proc_rss_mb``) keeps rising.

    A sample *rises* when it is more than :data:`MEM_RISE` (and 1 MB) above the previous one,
    and by as much above the other ranks' median rise then (so warm-up, when every rank grows,
    is no rise). A rank's rises are tested against how often the other ranks' memory rises so
    (rules 3-4), and the growth over the window must be at least :data:`MEM_MIN_GROWTH` of the
    level. A leak that every rank shares alike is not told from the job's own growth here. The samples are those in the
    window of steps: on a CPU the agent samples memory about once a second, so a leak shows
    after that many seconds, not steps.

    >>> rows = [{"rank": r, "step": s, "device_mem_mb": 1000.0 + (8.0 * s if r == 1 else s % 2)}
    ...         for s in range(40) for r in range(4)]
    >>> [(a["rank"], a["step"]) for a in memory_growth(rows)][:1]
    [(1, 9)]
    """
    m = StepMatrix.of(table, job)
    d = derive(m)
    job = job if job is not None else m.job
    if "mem_bins" not in d:
        return []
    name = next(c for c in MEMORY_COLUMNS if c in m.cols)
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        for col, v in sorted(persistent(d["mem_bins"], row, (1.0,), cum=d["mem_cum"],
                                        alpha=ALPHA / len(m.ranks)).items()):
            start = int(max(0, row - v.n))
            first, last = float(d["mem"][start, col]), float(d["mem"][row, col])
            growth = (last - first) / max(abs(first), 1e-9)
            if not growth >= MEM_MIN_GROWTH:
                continue
            rank, step = int(m.ranks[col]), int(m.steps[row])
            alerts.append({
                "kind": "memory_growth", "job": job, "rank": rank, "step": step,
                "message": (f"rank {rank}'s memory ({name}) keeps growing: {first:.0f} -> "
                            f"{last:.0f} MB (+{growth:.1%}), up in {v.k} of its last {v.n} "
                            f"samples; the other ranks' rises in {v.p:.0%} of theirs (chance "
                            f"{v.chance:.0e})"),
                "evidence": {"metric": name, "from_mb": first, "to_mb": last, "growth": growth,
                             "ups": v.k, "samples": v.n, "noise_rate": v.p, "chance": v.chance},
            })
    return alerts


# -- NaN / Inf ---------------------------------------------------------------------------------

def nonfinite(table: Any, steps: Iterable[int] | None = None, *,
              job: str | None = None) -> list[Alert]:
    """NaN/Inf in the loss or the gradients (``nonfinite_grads`` > 0 or a non-finite grad
    norm): one alert per step, naming the lowest rank with a non-finite loss (where it began:
    the gradient all-reduce spreads it to every rank), else the lowest with bad gradients.

    >>> [(a["rank"], a["step"]) for a in nonfinite([{"rank": 0, "step": 3, "loss": float("nan")}])]
    [(0, 3)]
    """
    m = StepMatrix.of(table, job)
    job = job if job is not None else m.job
    loss, gnorm, bad = m.col("loss"), m.col("grad_norm"), m.col("nonfinite_grads")
    none = np.zeros(loss.shape, dtype=bool)
    reported_loss, reported_gn, reported_bad = (m.reported.get(n, none) for n in CHECKED_COLUMNS)
    bad_loss = reported_loss & ~np.isfinite(loss)
    bad_grad = (reported_gn & ~np.isfinite(gnorm)) | (reported_bad & (np.nan_to_num(bad, nan=1.0) != 0))
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        lr, gr = np.flatnonzero(bad_loss[row]), np.flatnonzero(bad_grad[row])
        if not lr.size and not gr.size:
            continue
        col = int(lr[0] if lr.size else gr[0])
        rank, step = int(m.ranks[col]), int(m.steps[row])
        where = []
        if bad_loss[row, col]:
            where.append(f"loss = {loss[row, col]}")
        b = bad[row, col]
        if reported_bad[row, col] and math.isfinite(b) and b > 0:
            where.append(f"{int(b)} non-finite gradient values")
        elif reported_bad[row, col] and not math.isfinite(b):
            where.append("non-finite gradient count")
        if reported_gn[row, col] and not math.isfinite(gnorm[row, col]):
            where.append(f"grad norm = {gnorm[row, col]}")
        others = ""
        if lr.size > 1 or gr.size > int(bad_grad[row, col]):
            others = (f"; non-finite loss on {lr.size} rank(s), gradients on {gr.size} of "
                      f"{len(m.ranks)}")
        alerts.append({"kind": "nonfinite", "rank": rank, "step": step, "job": job,
                       "message": f"rank {rank} step {step}: " + ", ".join(where) + others,
                       "evidence": {"loss": _py(loss[row, col]), "grad_norm": _py(gnorm[row, col]),
                                    "nonfinite_grads": _py(b),
                                    "loss_ranks": [int(m.ranks[i]) for i in lr[:32]],
                                    "grad_ranks": len(gr)}})
    return alerts


def _py(v: float) -> float | None:
    return None if v is None else float(v)
