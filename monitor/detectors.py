"""Detectors: pure functions over per-(rank, step) series that return alerts with evidence.

The input is a :class:`StepMatrix` (or anything :meth:`StepMatrix.of` takes: the table
:meth:`monitor.storage.MonitorStore.step_table` returns, any Arrow table or list of dicts with
``rank``, ``step`` and some of ``step_time_ms``, ``compute_time_ms``, ``comm_time_ms``,
``data_time_ms``, ``loss``, ``grad_norm``, ``nonfinite_grads``, ``device_mem_mb``,
``proc_rss_mb``, ``traced``). Each detector judges the steps in ``steps`` (all when ``None``)
and uses the rest of the matrix as history. An alert is a dict: ``kind``, ``job``, ``rank``,
``step``, ``message`` (the evidence in words) and ``evidence`` (the numbers behind it).

How a timing detector decides (the same four rules for all of them):

1. **Robust baselines.** A rank's own work (compute + data loading) is compared with the
   median of the *other* ranks at the same step (a log ratio, so 1.5x reads the same at 5 ms and
   at 5 s); the job's step time with the median of its own earlier steps. Medians, so one
   hiccup moves nothing.
2. **Own work apart from waiting.** In a synchronous data-parallel step every rank waits in
   the gradient all-reduce for the slowest one: step times are equal, and the waiting shows as
   *communication* time on the healthy ranks. So a straggler is judged on its own work, and a
   job-wide slowdown is split into compute, data loading, transfers (the least communication
   time of any rank: the rank nobody waited for) and waiting; waiting is a straggler's doing.
3. **Noise measured on this job.** For each deviation level ``theta`` in :data:`LEVELS` the
   detector counts how often the *other* ranks (leave-one-out; for the job-wide series, the
   job's own earlier steps) exceed it, over the last :data:`HISTORY` steps, and how often such
   an excess runs on into the next step: ``p = (exceedances + 1) / (samples + 2)`` (few
   samples: high ``p``, so a young job needs more evidence) and ``p11``, the chance an excess
   continues, shrunk towards ``p`` (bursts, such as a shared-core neighbour, make ``p11 > p``).
   A rank's own past (before the window judged) counts too, shrunk towards the pooled rates
   (:data:`OWN_PRIOR`), and the larger rate is used: a rank with a bursty neighbour is judged
   by its own bursts, not by its quiet peers' (unless it was above the level in most of its
   past: then it was a straggler already, not a noisy rank).
4. **Persistence, k of n.** An alert needs the deviation above ``theta`` in ``k`` of the last
   ``n`` steps (``n`` in :data:`WINDOWS`), with ``k`` so many that the measured noise (a
   two-state Markov chain with ``p`` and ``p11``) gives it a chance below :data:`ALPHA`
   (shared by the ranks: below ``ALPHA / ranks`` for one rank). A big deviation passes in a
   few steps, a small one needs more; none below the smallest level (10% for a rank, 20% for
   the job) is ever reported, whatever the noise, and a straggler must also have cost the job
   :data:`MIN_EXCESS` (15%) over its window.

- :func:`stragglers`: a rank whose own work stays above its peers' (cause ``compute`` or
  ``data loading``), or, when its own work does not, whose step stays longer with the excess
  in communication (cause ``communication``). Waiting longer in a collective is no straggling.
- :func:`slow_steps`: the job's steps became slower than its own recent history, with the
  phase that grew (``compute``, ``data loading``, ``communication``); not when the growth is
  waiting for a straggler (that one has its own alert) and never for one lone slow step.
- :func:`memory_growth`: a rank whose memory rises sample after sample (more often than the
  other ranks' does, and at least 1% over the window).
- :func:`nonfinite`: NaN/Inf in the loss or the gradients, one alert per step naming the rank
  where it showed first (a NaN loss on one rank becomes NaN gradients on all after the
  all-reduce).
- :func:`hangs`: from each rank's report of the collective it is in (not a step series): the
  ranks of a group stopped in a collective that a rank never entered.

A step a rank ran under a deep trace or while sending its files (``traced`` > 0, set by the
agent) carries the trace's own cost: it is neither judged nor used as history or as a peer.
The profiler starts before the first traced step and writes its trace after the last, so the
other ranks wait for it in their next collective: a step at which some rank ran traced, or the
step after one, is judged on own work only (no "communication" verdict, which waiting would
fake), only with three untraced ranks at least (a median over one peer is no median), and the
job-wide series leaves it out.

>>> rows = [{"rank": r, "step": s, "step_time_ms": 10.0, "compute_time_ms": 30.0 if r == 2 else 8.0,
...          "data_time_ms": 1.0, "comm_time_ms": 1.0} for s in range(8) for r in range(16)]
>>> [(a["kind"], a["rank"], a["step"], a["evidence"]["cause"]) for a in stragglers(rows)][:1]
[('straggler', 2, 4, 'compute')]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

Alert = dict[str, Any]

#: The false-alert budget of a job: a chance, under the noise measured on the job, of one in a
#: million judged steps. Its ranks share it: a rank's run of deviations is reported when its
#: chance is below ``ALPHA / ranks`` (2.5e-7 for 4 ranks, 1e-10 for 10,000), so a bigger job
#: needs no more false alerts a step than a small one, and a small job is not made to wait for
#: the evidence 10,000 ranks need. (Windows and levels overlap: they are not counted apart.)
ALPHA = 1e-6
#: Deviation levels a rank's own work is tested at, as ratios to its peers' median.
LEVELS = (1.1, 1.2, 1.35, 1.5, 2.0, 3.0)
#: A straggler must cost: its own work at least this much above its peers' median on average
#: over the window (each step's excess capped at 100%, so one hiccup is one slow step). Less is
#: within what shared machines do to a healthy rank (a neighbour's bursts, a slower core) and
#: not worth an alert at 10,000 ranks; the smallest straggler the issue names, 1.2x, costs 20%.
#: (The lowest level, 1.1x, is where the evidence for such a rank is counted.)
MIN_EXCESS = 0.15
#: Levels the job's step time is tested at, as ratios to its own recent median: below 1.2x a
#: job-wide change is within what load on shared machines does to a job from minute to minute.
JOB_LEVELS = (1.2, 1.35, 1.5, 2.0, 3.0)
#: The k-of-n windows: the last n judged steps.
WINDOWS = (5, 7, 10, 14, 20, 30, 50)
#: The windows of the job-wide series (one series, not one per rank: fewer lengths suffice).
JOB_WINDOWS = (5, 10, 20, 50)
#: Steps of history the noise is measured over.
HISTORY = 100
#: The job-wide baseline: the median of at most this many steps before the window judged...
BASELINE = 50
#: ...and of at least this many.
MIN_BASELINE = 10
#: A memory sample counts as a rise when it is this fraction of the level above the last one
#: (2 MB of 20 GB; and at least 1 MB): smaller changes are the allocator's rounding.
MEM_RISE = 1e-4
#: A memory rise smaller than this fraction of the level over the window is allocator jitter.
MEM_MIN_GROWTH = 0.01
#: How strongly the chance that an excess continues is pulled towards independence (in
#: pseudo-observations): with no excess seen yet, runs are assumed no likelier than chance.
RUN_PRIOR = 2.0
#: How much the pooled rate weighs against a rank's own past (in steps): a young rank is judged
#: by the job's noise, one with a long history also by its own (the larger of the two).
OWN_PRIOR = 10.0

TIMING_COLUMNS = ("step_time_ms", "compute_time_ms", "comm_time_ms", "data_time_ms")
MEMORY_COLUMNS = ("device_mem_mb", "proc_rss_mb")
#: Columns whose NaN/Inf is news (:func:`nonfinite`), not a missing value.
CHECKED_COLUMNS = ("loss", "grad_norm", "nonfinite_grads")


# -- the input ---------------------------------------------------------------------------------

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


# -- the building blocks -----------------------------------------------------------------------

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
        p11 = np.maximum((runs + RUN_PRIOR * p) / (starts + RUN_PRIOR), p)
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
        p11 = (N11 + RUN_PRIOR * p) / (N1 + RUN_PRIOR)
        out += [p, np.maximum(p11, p)]
    return tuple(out)


@dataclass
class _Verdict:
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
               alpha: float = ALPHA, windows: Sequence[int] = WINDOWS) -> dict[int, _Verdict]:
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
    found: dict[int, _Verdict] = {}
    for i in np.flatnonzero(chance < alpha):
        col = int(c[i])
        old = found.get(col)
        level = levels[int(j[i]) - 1]
        if old is not None and (old.level > level or old.level == level and old.chance <= chance[i]):
            continue
        first = row - int(w[i]) + 1
        hits = np.flatnonzero(bins[first:row + 1, col] >= j[i]) + first
        found[col] = _Verdict(level, int(k[i]), int(n[i]), float(pc[i]), float(p11c[i]),
                              float(chance[i]), hits, first)
    return found


def _traced(m: StepMatrix) -> np.ndarray:
    return np.nan_to_num(m.col("traced"), nan=0.0) > 0


def _own_work(m: StepMatrix) -> np.ndarray:
    """compute + data loading (or step time minus communication), NaN where traced."""
    compute, data = m.col("compute_time_ms"), m.col("data_time_ms")
    some = ~(np.isnan(compute) & np.isnan(data))
    work = np.where(some, np.nan_to_num(compute) + np.nan_to_num(data),
                    m.col("step_time_ms") - np.nan_to_num(m.col("comm_time_ms")))
    return np.where(_traced(m), np.nan, work)


def row_median(values: np.ndarray, how: str = "median") -> np.ndarray:
    """Per row: the median (or ``"min"``) of the non-NaN values; NaN for an empty row.

    >>> row_median(np.array([[3.0, np.nan, 1.0, 2.0], [np.nan] * 4])).tolist()
    [2.0, nan]
    """
    if values.shape[1] == 0:
        return np.full(values.shape[0], np.nan)
    if how == "min":
        with np.errstate(all="ignore"), _quiet():
            return np.nanmin(values, axis=1)
    srt = np.sort(values, axis=1)                                       # NaN sort last
    n = (~np.isnan(values)).sum(axis=1)
    i1, i2 = np.maximum(n - 1, 0) // 2, n // 2
    i2 = np.minimum(i2, values.shape[1] - 1)
    rows = np.arange(values.shape[0])
    out = 0.5 * (srt[rows, i1] + srt[rows, i2])
    return np.where(n > 0, out, np.nan)


#: The job-wide series :func:`derive` keeps per step, in this order.
JOB_SERIES = ("step", "compute", "data loading", "communication", "comm_all")


def derive(m: StepMatrix, start: int | None = None) -> dict[str, np.ndarray]:
    """The series the detectors read, for the rows from ``start`` on (the rows before are
    context); with ``start=None``, for every row not derived yet, stored in ``m.derived``.

    - ``x_own``, ``x_step``: :func:`peer_excess` of own work and of step time; traced cells
      NaN; near a trace (the step of one and the next), ``x_step`` NaN and ``x_own`` NaN unless
      three ranks are untraced; ``own_bins``, ``step_bins``: their :func:`level_bins`;
    - ``job``: ``[steps, 5]`` of :data:`JOB_SERIES`: the median step time, compute and data
      time over untraced ranks, the least communication time (transfers), the median one; NaN
      near a trace;
    - ``mem``: the memory column carried forward over steps without a sample; ``mem_bins``:
      1 where a sample rose by more than :data:`MEM_RISE` (and 1 MB) above the previous one
      and above the other ranks' median rise at that step (so warm-up, when every rank
      grows, is no rise), 0 where it did not, -1 where there is no new sample.
    """
    if start is None:
        have = len(m.derived.get("x_own", ()))
        if have == len(m.steps):
            return m.derived
        new = derive(m, have)
        m.derived = {k: np.concatenate([_blank(v, have) if k not in m.derived else
                                        m.derived[k][:have], v]) if have else v
                     for k, v in new.items()}
        return m.derived
    ctx = max(0, start - 1)
    sub = StepMatrix(m.steps[ctx:], m.ranks, {k: v[ctx:] for k, v in m.cols.items()}, m.job)
    skip = start - ctx                                      # the context row, when there is one
    traced = _traced(sub)
    traced_steps = set(sub.steps[traced.any(axis=1)].tolist())
    disturbed = np.array([int(s) in traced_steps or int(s) - 1 in traced_steps
                          for s in sub.steps], dtype=bool)[skip:]
    own = _own_work(sub)[skip:]
    step = np.where(traced, np.nan, sub.col("step_time_ms"))[skip:]
    x_own = peer_excess(own)
    x_own[disturbed & ((~np.isnan(own)).sum(axis=1) < 3)] = np.nan
    x_step = peer_excess(step)
    x_step[disturbed] = np.nan
    job = np.empty((len(step), len(JOB_SERIES)))
    for i, (key, how) in enumerate((("step_time_ms", "median"), ("compute_time_ms", "median"),
                                    ("data_time_ms", "median"), ("comm_time_ms", "min"),
                                    ("comm_time_ms", "median"))):
        job[:, i] = row_median(np.where(traced, np.nan, sub.col(key))[skip:], how)
    job[disturbed] = np.nan
    out = {"x_own": x_own, "x_step": x_step, "own_bins": level_bins(x_own, LEVELS),
           "step_bins": level_bins(x_step, LEVELS), "job": job}
    for name in ("own", "step"):
        b = out[f"{name}_bins"]
        have = start > 0 and f"{name}_cum" in m.derived
        out[f"{name}_cum"] = cumulate(b, len(LEVELS),
                                      m.derived[f"{name}_bins"][start - 1] if have else None,
                                      m.derived[f"{name}_cum"][start - 1] if have else None)
    name = next((c for c in MEMORY_COLUMNS if c in m.cols), None)
    if name is not None:
        raw = sub.cols[name][skip:]
        before = (m.derived["mem"][start - 1] if start and "mem" in m.derived
                  else np.full(len(m.ranks), np.nan))
        filled = np.vstack([before[None, :], raw])
        for i in range(1, len(filled)):                     # carry the last sample forward
            filled[i] = np.where(np.isnan(filled[i]), filled[i - 1], filled[i])
        prev = filled[:-1]
        with np.errstate(all="ignore"):
            up = raw - prev
            beyond = up - row_median(up)[:, None] if up.shape[1] > 1 else up
        rise = (up > np.maximum(1.0, MEM_RISE * np.abs(prev))) & (beyond > MEM_RISE * np.abs(prev))
        out["mem"] = filled[1:]
        out["mem_bins"] = np.where(np.isnan(raw) | np.isnan(prev), -1, rise).astype(np.int8)
        have = start > 0 and "mem_cum" in m.derived
        out["mem_cum"] = cumulate(out["mem_bins"], 1,
                                  m.derived["mem_bins"][start - 1] if have else None,
                                  m.derived["mem_cum"][start - 1] if have else None)
    return out


def _blank(like: np.ndarray, rows: int) -> np.ndarray:
    """``rows`` rows shaped as ``like``'s, meaning "nothing": NaN, or -1 for level bins."""
    return np.full((rows,) + like.shape[1:], -1 if like.dtype == np.int8 else np.nan, like.dtype)


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
                      d["x_own"], row)
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


def _costly(found: dict[int, _Verdict], x: np.ndarray, row: int) -> dict[int, _Verdict]:
    """The verdicts whose rank cost the job at least :data:`MIN_EXCESS` over their window: the
    mean excess over the peers' median, each step's capped at 100% (a lone 10x hiccup is one
    slow step, not a slow rank)."""
    out = {}
    for col, v in found.items():
        e = np.clip(np.expm1(x[v.first:row + 1, col]), -1.0, 1.0)
        e = e[~np.isnan(e)]
        if e.size and e.mean() >= MIN_EXCESS:
            out[col] = v
    return out


def _excess(m: StepMatrix, name: str, col: int, rows: np.ndarray) -> float | None:
    """Median over ``rows`` of the rank's ``name`` minus the other ranks' median (ms)."""
    values = np.where(_traced(m)[rows], np.nan, m.col(name)[rows])
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


def _straggler_alert(m: StepMatrix, job: str | None, row: int, col: int, v: _Verdict,
                     cause: str, series: np.ndarray, excess: dict[str, float]) -> Alert:
    rank, step = int(m.ranks[col]), int(m.steps[row])
    ratio = float(np.exp(np.median(series[v.hits, col])))
    what = "step time" if cause == "communication" else "own work (compute + data)"
    return {
        "kind": "straggler", "job": job, "rank": rank, "step": step,
        "message": (f"rank {rank} is a straggler ({cause}): its {what} is {ratio:.2f}x its "
                    f"peers' median, above {v.level:g}x in {v.k} of its last {v.n} steps; the "
                    f"other ranks are above {v.level:g}x in {v.p:.1%} of theirs (chance "
                    f"{v.chance:.0e})"),
        "evidence": {"cause": cause, "ratio": ratio, "level": v.level, "k": v.k, "n": v.n,
                     "noise_rate": v.p, "run_rate": v.p11, "chance": v.chance,
                     "excess_ms": excess,
                     "outlier_steps": [int(m.steps[i]) for i in v.hits],
                     "ranks_at_step": int((~np.isnan(series[row])).sum())},
    }


# -- slow steps (job-wide) ---------------------------------------------------------------------

class _quiet:
    """Silence numpy's all-NaN-slice warnings inside a block."""

    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._w.__exit__(*exc)


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
    [(44, 'compute')]
    """
    m = StepMatrix.of(table, job)
    js = derive(m)["job"]
    job = job if job is not None else m.job
    step = js[:, 0]
    alerts: list[Alert] = []
    for row in m.rows_of(steps):
        if np.isnan(step[row]):
            continue
        best: tuple[_Verdict, float, int, str] | None = None
        names = ("step", "compute", "data loading", "communication")
        for w in JOB_WINDOWS:
            lo = row - w + 1
            first = max(0, lo - BASELINE)
            ref = _nanmedian(step[first:max(0, lo)])
            if lo < 0 or (~np.isnan(step[first:lo])).sum() < MIN_BASELINE or not ref > 0:
                continue
            # each series as the step time the job would have if only it had changed
            series = js[first:row + 1, :4].copy()
            with _quiet():
                base = np.nanmedian(series[:lo - first], axis=0)
            series[:, 1:] = ref + (series[:, 1:] - base[None, 1:])
            with np.errstate(all="ignore"):
                bins = level_bins(np.log(np.maximum(series, 1e-12) / ref), JOB_LEVELS)
            noise = bins.copy()
            noise[-w:] = -1                              # the window is judged, not noise
            for col, v in persistent(bins, len(bins) - 1, JOB_LEVELS, leave_out=False,
                                     history=len(bins), noise=noise, windows=(w,)).items():
                if best is None or v.chance < best[0].chance:
                    v.hits = v.hits + first
                    best = (v, ref, lo, names[col])
        if best is None:
            continue
        v, ref, lo, series_name = best
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
                        + f"; above {v.level:g}x in {v.k} of the last {v.n} steps, chance "
                        f"{v.chance:.0e} by its own noise"),
            "evidence": {"step_time_ms": now, "median_ms": ref, "ratio": now / ref,
                         "level": v.level, "k": v.k, "n": v.n, "noise_rate": v.p,
                         "run_rate": v.p11, "chance": v.chance, "phase": phase,
                         "series": series_name, "growth_ms": dict(growth, waiting=waiting),
                         "slow_steps": [int(m.steps[i]) for i in v.hits]},
        })
    return alerts


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
    [(1, 6)]
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


# -- all of them -------------------------------------------------------------------------------

def detect(table: Any, steps: Iterable[int] | None = None, *, job: str | None = None) -> list[Alert]:
    """All step detectors over one matrix: non-finite values, stragglers, slow steps, memory."""
    m = StepMatrix.of(table, job)
    steps = None if steps is None else list(steps)
    return (nonfinite(m, steps, job=job) + stragglers(m, steps, job=job)
            + slow_steps(m, steps, job=job) + memory_growth(m, steps, job=job))


# -- hangs -------------------------------------------------------------------------------------

#: Point-to-point operations: their sequence numbers do not line up across ranks.
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
                     "recv_object_list"})
#: A collective waited in longer than this (seconds) may be a hang...
HANG_MIN_S = 5.0
#: ...and longer than this many typical steps, and twice the longest step after the first...
HANG_STEP_FACTOR = 10.0
#: ...and, before the job finished a step (communicators are set up, code is compiled), this.
HANG_START_S = 60.0
#: A rank's agent reports at least every ~1.2 s (a batch or a heartbeat); one silent for longer
#: than this since the others entered the collective is silent, not merely not heard yet.
REPORT_GRACE_S = 3.0


def hang_threshold_s(step_times_ms: Sequence[float]) -> float:
    """Seconds ranks must wait in one collective before it is called a hang: at least
    :data:`HANG_MIN_S`, ten typical steps (the median step) and twice the longest step after
    the first (the first pays for start-up); :data:`HANG_START_S` before any step ended.
    A job with a 60 s checkpoint now and then gets 120 s after its first one.

    >>> hang_threshold_s([]), hang_threshold_s([900.0, 30.0, 40.0]), hang_threshold_s([10, 2000, 2100])
    (60.0, 5.0, 20.0)
    """
    times = [t for t in step_times_ms if t is not None and math.isfinite(t)]
    if not times:
        return HANG_START_S
    later = times[1:] or times
    return max(HANG_MIN_S, HANG_STEP_FACTOR * float(np.median(times)) / 1e3,
               2.0 * max(later) / 1e3)


def _group_members(group: str, world: Sequence[int]) -> list[int]:
    if group in ("", "world"):
        return sorted(world)
    try:
        return sorted(int(r) for r in group.split(","))
    except ValueError:
        return sorted(world)


def hangs(reports: Sequence[Mapping[str, Any]], *, threshold_s: float, job: str | None = None,
          world: Sequence[int] | None = None) -> list[Alert]:
    """Groups whose ranks wait in one collective longer than ``threshold_s``, and why.

    ``reports`` has one dict per rank: ``rank``, ``step`` (the step it is in), ``pending``
    (None, or the collective it entered and has not left: ``op``, ``seq``, ``group``,
    ``bytes``, ``waiting_s`` as of now), ``entered`` ({group: the last sequence number it
    entered}), ``reported_s`` (seconds since that report; None: it never reported its
    collectives), ``final``. Sequence numbers count each rank's collectives per group, so the
    ranks of a group agree on them.

    For the (group, seq) waited in longest, each other member is: in another collective of
    the group (a mismatch: what it is in); past it (it left, the others did not); before it,
    by a report made after the others entered: it never entered (the culprit, with its step);
    silent for longer than :data:`REPORT_GRACE_S` since before they entered (a frozen process:
    a culprit too); or not heard of since they entered, not yet that long, or never reporting
    its collectives: undecided, and no alert is raised until its next report says. The alert
    names the culprits (``rank``: the lowest), what the others wait in, and for how long; with
    no culprit, the collective itself does not complete.

    >>> reps = [{"rank": r, "step": 7, "pending": {"op": "all_reduce", "seq": 8, "group": "world",
    ...          "bytes": 4096, "waiting_s": 9.0}, "entered": {"world": 8}, "reported_s": 0.5}
    ...         for r in (0, 2, 3)]
    >>> reps.append({"rank": 1, "step": 7, "pending": None, "entered": {"world": 7}, "reported_s": 0.4})
    >>> [(a["rank"], a["evidence"]["op"], a["evidence"]["seq"]) for a in hangs(reps, threshold_s=5)]
    [(1, 'all_reduce', 8)]
    """
    by_rank = {int(r["rank"]): r for r in reports}
    world = sorted(world if world is not None else by_rank)
    stuck: dict[tuple[str, int], list[int]] = {}
    for rank, r in sorted(by_rank.items()):
        p = r.get("pending")
        if (p and not r.get("final") and p.get("op") not in P2P_OPS
                and float(p.get("waiting_s") or 0.0) > threshold_s):
            stuck.setdefault((p.get("group") or "world", int(p["seq"])), []).append(rank)
    alerts: list[Alert] = []
    for (group, seq), at_seq in sorted(stuck.items()):
        members = _group_members(group, world)
        ops = [by_rank[r]["pending"].get("op") for r in at_seq]
        op = max(set(ops), key=lambda o: (ops.count(o), o))      # what most of them are in
        waiting = [r for r in at_seq if by_rank[r]["pending"].get("op") == op]
        first = by_rank[waiting[0]]["pending"]
        nbytes = first.get("bytes")
        wait_s = max(float(by_rank[r]["pending"].get("waiting_s") or 0) for r in waiting)
        states: dict[int, str] = {}
        culprits, elsewhere, undecided = [], [], []
        for rank in members:
            r = by_rank.get(rank)
            if rank in waiting:
                continue
            if r is None:
                states[rank] = "never heard of"
                culprits.append(rank)
                continue
            p, reported = r.get("pending"), r.get("reported_s")
            entered = int((r.get("entered") or {}).get(group, -1))
            if not r.get("final") and (reported is None or reported > wait_s):
                if reported is None or reported <= REPORT_GRACE_S:
                    undecided.append(rank)
                    continue
                states[rank] = (f"silent for {reported:.1f} s, since before the others entered "
                                f"(last at step {r.get('step')}, entered #{entered})")
                culprits.append(rank)
                continue
            heard = float(reported)
            if r.get("final"):
                states[rank] = f"finished training (last step {r.get('step')})"
                culprits.append(rank)
            elif p and (p.get("group") or "world") == group:
                states[rank] = (f"in {p.get('op')} #{p.get('seq')} instead "
                                f"({float(p.get('waiting_s') or 0):.1f} s)")
                elsewhere.append(rank)
            elif entered >= seq:
                states[rank] = f"left it (at #{entered} now)"
            else:
                where = f"in {p.get('op')} on group {p.get('group')}" if p else "in no collective"
                states[rank] = (f"never entered it: at step {r.get('step')}, {where}, last "
                                f"entered #{entered}, heard of {heard:.1f} s ago")
                culprits.append(rank)
        if undecided:
            continue                                # its next report (within ~1 s) decides
        blamed = culprits + elsewhere
        size = f", {nbytes / 2**20:.1f} MiB" if nbytes else ""
        what = f"{op} #{seq} (group {group}{size})"
        waiters = _ranks_text(waiting)
        if blamed:
            head = (f"hang: rank{'s' if len(blamed) > 1 else ''} {_ranks_text(blamed)} never "
                    f"entered {what}" if culprits and not elsewhere else
                    f"hang: rank{'s' if len(blamed) > 1 else ''} {_ranks_text(blamed)} "
                    f"{'are' if len(blamed) > 1 else 'is'} not in {what}")
            detail = "; ".join(f"rank {k}: {states[k]}" for k in blamed[:8])
            who = (f"ranks {waiters} have" if len(waiting) > 1 else f"rank {waiters} has")
            message = f"{head}; {who} waited in it for {wait_s:.1f} s ({detail})"
        else:
            message = (f"hang: every rank of group {group} ({waiters}) has waited in {what} for "
                       f"{wait_s:.1f} s: no rank is missing, the collective itself does not "
                       "complete (network, backend, or a rank outside the job)")
        alerts.append({
            "kind": "hang", "job": job, "rank": min(blamed) if blamed else None,
            "step": max((int(by_rank[r].get("step") or -1) for r in waiting), default=-1),
            "message": message,
            "evidence": {"op": op, "seq": seq, "group": group, "bytes": nbytes,
                         "waiting_s": wait_s, "threshold_s": threshold_s,
                         "waiting_ranks": waiting, "culprits": culprits,
                         "elsewhere": elsewhere,
                         "states": {str(k): v for k, v in states.items()}},
        })
    return alerts


def _ranks_text(ranks: Sequence[int], most: int = 12) -> str:
    ranks = sorted(ranks)
    text = ", ".join(map(str, ranks[:most]))
    return text + (f" and {len(ranks) - most} more" if len(ranks) > most else "")
