"""The detectors' statistics (rules 3 and 4 of :mod:`probe.monitor.detectors.step_detectors`): deviations from
the peers' median, level bins, running counts, the noise measured on the job and the k-of-n
persistence test under a two-state Markov chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

#: The false-alert budget of a job: a chance, under the noise measured on the job, of one in a
#: million judged steps. Its ranks share it: a rank's run of deviations is reported when its
#: chance is below ``ALPHA / ranks`` (2.5e-7 for 4 ranks, 1e-10 for 10,000), so a bigger job
#: needs no more false alerts a step than a small one, and a small job is not made to wait for
#: the evidence 10,000 ranks need. (Windows and levels overlap: they are not counted apart.)
ALPHA = 1e-6
#: Deviation levels a rank's own work is tested at, as ratios to its peers' median.
LEVELS = (1.1, 1.2, 1.35, 1.5, 2.0, 3.0)
#: The k-of-n windows: the last n judged steps.
WINDOWS = (5, 7, 10, 14, 20, 30, 50)
#: Steps of history the noise is measured over.
HISTORY = 100
#: How strongly the chance that an excess continues is pulled towards independence (in
#: pseudo-observations): with no excess seen yet, runs are assumed no likelier than chance.
RUN_PRIOR = 2.0
#: The noise rates are taken this many standard errors above their estimates: measured on few
#: samples (two ranks, a young job), a rate is uncertain, and a run is judged against the rate
#: the job may well have, not the one it happened to show (see :func:`upper`).
NOISE_SE = 1.0
#: How much the pooled rate weighs against a rank's own past (in steps): a young rank is judged
#: by the job's noise, one with a long history also by its own (the larger of the two).
OWN_PRIOR = 10.0


def peer_excess(values: np.ndarray) -> np.ndarray:
    """``log(value) - median of the other ranks' log(value)`` per step (row); NaN where the
    value is missing or not positive, or no other rank has one. (The median of two is their
    geometric mean.)

    >>> peer_excess(np.array([[1.0, 1.0, 3.0], [2.0, np.nan, 2.0]])).round(3).tolist()
    [[-0.549, -0.549, 1.099], [0.0, nan, 0.0]]
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.where(values > 0, np.log(np.where(values > 0, values, 1.0)), np.nan)
    if lv.size == 0:
        return lv
    order = np.argsort(lv, axis=1, kind="stable")          # NaN sort last
    srt = np.take_along_axis(lv, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(lv.shape[1])[None, :].repeat(lv.shape[0], 0), axis=1)
    valid = ~np.isnan(lv)
    others = valid.sum(axis=1, keepdims=True) - 1            # peers with a value
    j1, j2 = np.maximum(others - 1, 0) // 2, np.maximum(others, 0) // 2
    last = lv.shape[1] - 1
    i1 = np.minimum(j1 + (j1 >= pos), last)
    i2 = np.minimum(j2 + (j2 >= pos), last)
    med = 0.5 * (np.take_along_axis(srt, i1, axis=1) + np.take_along_axis(srt, i2, axis=1))
    return np.where(valid & (others >= 1), lv - med, np.nan)


def run_chance(k: np.ndarray, n: np.ndarray, p: np.ndarray, p11: np.ndarray) -> np.ndarray:
    """The chance of at least ``k`` excesses in ``n`` steps when an excess happens with
    probability ``p`` and continues into the next step with ``p11`` (a stationary two-state
    Markov chain; ``p11 == p`` is the binomial). Arrays of one shape, one test each.

    >>> float(run_chance(np.array([5]), np.array([5]), np.array([0.1]), np.array([0.1]))[0])
    1.0000000000000004e-05
    >>> float(run_chance(np.array([5]), np.array([5]), np.array([0.1]), np.array([0.5]))[0]) > 1e-3
    True
    """
    k, n = np.asarray(k, dtype=int), np.asarray(n, dtype=int)
    p = np.clip(np.asarray(p, dtype=float), 1e-12, 1 - 1e-12)
    p11 = np.clip(np.asarray(p11, dtype=float), 1e-12, 1 - 1e-12)
    p01 = np.clip(p * (1 - p11) / (1 - p), 1e-12, 1 - 1e-12)
    out = np.zeros(k.shape)
    if k.size == 0:
        return out
    top = int(n.max())
    # dp[c, j, s]: chance of j excesses so far, the last step in state s (1 = excess)
    dp = np.zeros((k.size, top + 2, 2))
    dp[:, 0, 0], dp[:, 1, 1] = 1 - p, p
    for t in range(1, top + 1):
        done = n == t
        if done.any():
            counts = np.arange(top + 2)[None, :] >= k[done][:, None]
            out[done] = (dp[done].sum(axis=2) * counts).sum(axis=1)
        stay0, go1 = dp[:, :, 0] * (1 - p01)[:, None], dp[:, :, 0] * p01[:, None]
        back0, stay1 = dp[:, :, 1] * (1 - p11)[:, None], dp[:, :, 1] * p11[:, None]
        new = np.zeros_like(dp)
        new[:, :, 0] = stay0 + back0
        new[:, 1:, 1] = (go1 + stay1)[:, :-1]
        dp = new
    out[k <= 0] = 1.0
    out[k > n] = 0.0
    return out


def level_bins(series: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """How many of ``levels`` (ratios) each log deviation exceeds; -1 where it is NaN.

    >>> level_bins(np.log(np.array([1.0, 1.15, 2.5, np.nan])), LEVELS).tolist()
    [0, 1, 5, -1]
    """
    thetas = np.log(np.asarray(levels, dtype=float))
    out = np.searchsorted(thetas, np.nan_to_num(series, nan=-np.inf), side="left").astype(np.int8)
    out[np.isnan(series)] = -1
    return out


def cumulate(bins: np.ndarray, n_levels: int, before: np.ndarray | None = None,
             cum_before: np.ndarray | None = None) -> np.ndarray:
    """Running counts down the rows of level bins ``[steps, columns]``: ``[steps, columns,
    1 + 3 * n_levels]`` int32 holding, for the rows up to each one, how many were judged, how
    many reached each level, how many consecutive pairs both reached it (runs) and how many
    pairs started at it with the next row judged (run starts). ``before``/``cum_before``: the
    bins and counts of the row just before (to go on from an earlier call).

    >>> c = cumulate(np.array([[1], [1], [-1], [0]], dtype=np.int8), 1)
    >>> c[-1, 0].tolist()                                   # judged, reached, runs, starts
    [3, 2, 1, 1]
    """
    L = n_levels
    idx = np.arange(1, L + 1, dtype=np.int8)
    prev = np.concatenate([(before if before is not None
                            else np.full(bins.shape[1], -1, np.int8))[None, :], bins[:-1]])
    step = np.empty(bins.shape + (1 + 3 * L,), dtype=np.int32)
    step[:, :, 0] = bins >= 0
    step[:, :, 1:1 + L] = bins[:, :, None] >= idx
    step[:, :, 1 + L:1 + 2 * L] = np.minimum(bins, prev)[:, :, None] >= idx
    step[:, :, 1 + 2 * L:] = np.where(bins >= 0, prev, -1)[:, :, None] >= idx
    out = np.cumsum(step, axis=0, dtype=np.int32)
    if cum_before is not None:
        out += cum_before[None]
    return out


def run_rate(runs: np.ndarray, starts: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The chance an excess runs on into the next step: ``runs`` of ``starts`` excesses did,
    shrunk towards ``p`` (independence) by :data:`RUN_PRIOR` pseudo-observations; at least
    ``p`` (bursts make it more, never less).

    >>> run_rate(np.array([8.0, 0.0]), np.array([10.0, 0.0]), np.array([0.2, 0.01])).round(2)
    array([0.7 , 0.01])
    """
    return np.maximum((runs + RUN_PRIOR * p) / (starts + RUN_PRIOR), p)


def upper(rate: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """``rate`` measured on ``samples`` observations, :data:`NOISE_SE` standard errors higher
    (at most 1): what the job's noise may be, given what it showed.

    >>> upper(np.array([0.1, 0.1]), np.array([100, 10000])).round(3).tolist()
    [0.13, 0.103]
    """
    rate = np.asarray(rate, dtype=float)
    return np.minimum(rate + NOISE_SE * np.sqrt(rate * (1 - rate) / (np.asarray(samples) + 1.0)),
                      1.0)


def _window(cum: np.ndarray, row: int, first: int, cols: Any = slice(None)) -> np.ndarray:
    """Counts over rows ``first..row`` (inclusive) of ``cum`` (see :func:`cumulate`)."""
    top = cum[row, cols]
    return top - cum[first - 1, cols] if first > 0 else top.copy()


def _noise(counts: np.ndarray, L: int, leave_out: bool,
           max_rate: float) -> tuple[np.ndarray, ...]:
    """``(p, p11, p_all, p11_all)``, each ``[columns, levels]``, from per-column counts over
    the history (:func:`cumulate`'s layout; rule 3): the rate of exceeding each level, at most
    ``max_rate``, and the chance an excess runs on into the next step, pooled over the other
    columns (``leave_out``), or each column's own (for series judged against their own past).
    The noisiest tenth of the columns at each level is left out of the pooled ``p``/``p11``: a
    rank with a bursty neighbour is judged by its own past (:func:`persistent`), and its bursts
    are not made everyone's; ``p_all``/``p11_all`` keep every column: a rank with little past
    is assumed as noisy as the average one."""
    samples = np.broadcast_to(counts[:, :1], (counts.shape[0], L))
    exceed, runs, starts = counts[:, 1:1 + L], counts[:, 1 + L:1 + 2 * L], counts[:, 1 + 2 * L:]
    if not leave_out:
        p = np.minimum((exceed + 1.0) / (samples + 2.0), max_rate)
        p11 = upper(run_rate(runs, starts, p), starts + RUN_PRIOR)
        p = np.minimum(upper(p, samples), max_rate)
        p11 = np.maximum(p11, p)
        return p, p11, p, p11
    cols = counts.shape[0]
    if cols >= 10:
        cut = np.partition(exceed, cols - 1 - cols // 10, axis=0)[cols - 1 - cols // 10]
        pooled = exceed <= cut[None, :]
    else:
        pooled = np.ones(exceed.shape, dtype=bool)
    out = []
    for mask in (pooled, np.ones(exceed.shape, dtype=bool)):
        E, V, N11, N1 = ((x * mask).sum(axis=0)[None, :] for x in (exceed, samples, runs, starts))
        E, V, N11, N1 = (t - x * mask for t, x in ((E, exceed), (V, samples), (N11, runs),
                                                   (N1, starts)))
        p = np.minimum((E + 1.0) / (V + 2.0), max_rate)
        p11 = upper(run_rate(N11, N1, p), N1 + RUN_PRIOR)
        p = np.minimum(upper(p, V), max_rate)
        out += [p, np.maximum(p11, p)]
    return tuple(out)


@dataclass
class Verdict:
    """The strongest persistent deviation of one series (rank or job) at one step."""

    level: float
    k: int
    n: int
    p: float
    p11: float
    chance: float
    hits: np.ndarray                                    # window rows above the level
    first: int = 0                                      # the window's first row


def persistent(bins: np.ndarray, row: int, levels: Sequence[float], *, leave_out: bool = True,
               history: int = HISTORY, noise: np.ndarray | None = None,
               cum: np.ndarray | None = None, max_rate: float = 1.0,
               alpha: float = ALPHA, windows: Sequence[int] = WINDOWS) -> dict[int, Verdict]:
    """Columns whose deviation at ``row`` ends a run unlikely under the measured noise
    (rules 3 and 4).

    ``bins`` ``[steps, columns]`` says how many of ``levels`` each step exceeds
    (:func:`level_bins`; -1: not judged); ``cum`` is its :func:`cumulate` when the caller
    keeps one. The noise comes from ``noise`` (bins of the same layout; default ``bins``) over
    the ``history`` rows up to ``row``: with ``leave_out``, from the other columns and from the
    column's own past before the window (the larger rate); else each column's own.
    Returns ``{column: verdict}``: for each column the highest level whose chance is below
    ``alpha`` in some window of ``windows``, in its least likely window.

    >>> x = np.zeros((12, 8)); x[4:, 3] = np.log(2.0)
    >>> sorted(persistent(level_bins(x, LEVELS), 11, LEVELS))
    [3]
    """
    cur = bins[row]
    cand = np.flatnonzero(cur >= 1)
    if cand.size == 0:
        return {}
    L = len(levels)
    lo = max(0, row - history + 1)
    if cum is None:
        cum = np.zeros((row + 1,) + bins.shape[1:] + (1 + 3 * L,), dtype=np.int32)
        cum[lo:] = cumulate(bins[lo:row + 1], L, bins[lo - 1] if lo else None)
    if noise is None:
        counts = _window(cum, row, lo)
    else:
        ncum = cumulate(noise[lo:row + 1], L, noise[lo - 1] if lo else None)
        counts = ncum[-1]
    p, p11, p_all, p11_all = _noise(counts, L, leave_out, max_rate)
    pool, pool11, prior, prior11 = (x[cand] for x in (p, p11, p_all, p11_all))
    top = cum[row, cand]
    idx = np.arange(1, L + 1)
    parts: list[tuple[np.ndarray, ...]] = []
    for w in windows:
        first = row - w + 1
        if first < lo:
            break                                          # only whole windows are judged
        at = cum[first - 1, cand] if first > 0 else np.zeros_like(top)
        win = top - at                                             # [cand, channels]
        k, n = win[:, 1:1 + L], np.broadcast_to(win[:, :1], (cand.size, L))
        pc, p11c = pool, pool11
        if leave_out:
            # the column's own past, shrunk towards every column's rates: the larger counts;
            # not when it was above the level in most of its past (it was a straggler then,
            # not a noisy rank)
            past = at - (cum[lo - 1, cand] if lo > 0 else 0)
            noisy = 2 * past[:, 1:1 + L] <= past[:, :1]
            pc = np.where(noisy, np.maximum(pool, (past[:, 1:1 + L] + OWN_PRIOR * prior)
                                            / (past[:, :1] + OWN_PRIOR)), pool)
            p11c = np.where(noisy, np.maximum(pool11, (past[:, 1 + L:1 + 2 * L]
                                                       + RUN_PRIOR * prior11)
                                              / (past[:, 1 + 2 * L:] + RUN_PRIOR)), pool11)
        # a cheap bound first: below 3 excesses, or 4 binomial standard deviations above the
        # expected count, is far from any alpha we use; and only levels reached now
        keep = ((k >= 3) & (k > n * pc + 4 * np.sqrt(n * pc * (1 - pc)))
                & (cur[cand][:, None] >= idx[None, :]))
        if keep.any():
            ci, li = np.nonzero(keep)
            parts.append((cand[ci], k[ci, li], n[ci, li], pc[ci, li], p11c[ci, li], li + 1,
                          np.full(ci.size, w)))
    if not parts:
        return {}
    c, k, n, pc, p11c, j, w = (np.concatenate(x) for x in zip(*parts))
    chance = run_chance(k, n, pc, p11c)
    found: dict[int, Verdict] = {}
    for i in np.flatnonzero(chance < alpha):
        col = int(c[i])
        old = found.get(col)
        level = levels[int(j[i]) - 1]
        if old is not None and (old.level > level or old.level == level and old.chance <= chance[i]):
            continue
        first = row - int(w[i]) + 1
        hits = np.flatnonzero(bins[first:row + 1, col] >= j[i]) + first
        found[col] = Verdict(level, int(k[i]), int(n[i]), float(pc[i]), float(p11c[i]),
                              float(chance[i]), hits, first)
    return found


def row_median(values: np.ndarray, how: str = "median") -> np.ndarray:
    """Per row: the median (or ``"min"``) of the non-NaN values; NaN for an empty row.

    >>> row_median(np.array([[3.0, np.nan, 1.0, 2.0], [np.nan] * 4])).tolist()
    [2.0, nan]
    """
    if values.shape[1] == 0:
        return np.full(values.shape[0], np.nan)
    if how == "min":
        with np.errstate(all="ignore"), quiet_nan_warnings():
            return np.nanmin(values, axis=1)
    missing = np.isnan(values)
    if not missing.any():             # every row full: its middle one or two by selection
        n = values.shape[1]
        i1, i2 = (n - 1) // 2, n // 2
        mid = np.partition(values, (i1, i2) if i1 != i2 else i1, axis=1)
        return 0.5 * (mid[:, i1] + mid[:, i2])
    srt = np.sort(values, axis=1)                                       # NaN sort last
    n = (~missing).sum(axis=1)
    i1, i2 = np.maximum(n - 1, 0) // 2, n // 2
    i2 = np.minimum(i2, values.shape[1] - 1)
    rows = np.arange(values.shape[0])
    out = 0.5 * (srt[rows, i1] + srt[rows, i2])
    return np.where(n > 0, out, np.nan)


class quiet_nan_warnings:
    """Silence numpy's all-NaN-slice warnings inside a block."""

    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._w.__exit__(*exc)
