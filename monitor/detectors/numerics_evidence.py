"""The numerics detectors' evidence (:mod:`probe.monitor.detectors.numerics`): each test's level bins
per (step, rank, module), derived once per row, and the k-of-n persistence of a deviation under
the noise of the other modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from probe.monitor.detectors.module_matrix import ModuleMatrix
from probe.monitor.detectors.noise_model import RUN_PRIOR, run_chance

Alert = dict[str, Any]

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
TESTS: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {
    **{f"z:{q}": ((q,), Z_LEVELS) for q in OWN_QUANTITIES},
    **{f"r:{q}": ((q,), RATIO_LEVELS) for q in LAYER_QUANTITIES},
    "u:update_ratio": (("update_ratio",), UPDATE_LEVELS),
}

Alert = dict[str, Any]


# -- the tests' level bins ----------------------------------------------------------------------

def log_values(values: np.ndarray) -> np.ndarray:
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
    logs = {q: log_values(m.values[q][first:]) for q in set(OWN_QUANTITIES) | set(LAYER_QUANTITIES)}
    shape = (len(m.ranks), len(m.modules))
    new: dict[str, list] = {name: [] for name in TESTS}
    for row in range(start, S):
        for name, bins in _row_bins(m, row, logs, first).items():
            new[name].append(bins)
    out: dict[str, np.ndarray] = {}
    for name, (_, levels) in TESTS.items():
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


def ensure_derived(m: ModuleMatrix) -> None:
    """Fill ``m.derived`` for the rows that lack it (all of them when any test lacks it)."""
    have = min((len(m.derived[n]) for n in TESTS if n in m.derived), default=0)
    if any(n not in m.derived for n in TESTS):
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


def persistent_findings(m: ModuleMatrix, test: str, row: int, alpha: float) -> list[Finding]:
    """The series of ``test`` whose excess at ``row`` ends a run unlikely under the noise
    measured on the other series (rules 3 and 4 of :mod:`probe.monitor.detectors.step_detectors`)."""
    bins, sums = m.derived[test], m.derived[test + "#"]
    levels = TESTS[test][1]
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


def make_alert(m: ModuleMatrix, kind: str, row: int, f: Finding, quantity: str, message: str,
           evidence: dict[str, Any]) -> Alert:
    rank, step, module = int(m.ranks[f.rank_col]), int(m.steps[row]), m.modules[f.module_col]
    return {"kind": kind, "job": m.job, "rank": rank, "step": step, "module": module,
            "quantity": quantity,
            "message": f"rank {rank} step {step}: {module} {quantity} " + message,
            "evidence": dict(evidence, module=module, quantity=quantity, level=f.level,
                             steps_over=f.k, window=f.n, noise_rate=f.p, chance=f.chance)}


def fmt(v: float) -> str:
    return f"{v:.3g}"

