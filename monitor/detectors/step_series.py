"""The series the detectors read, derived once per row of a :class:`StepMatrix` (and kept in
``StepMatrix.derived`` when the caller keeps the matrix): own work and step time against the
peers, the job-wide medians, memory rises.
"""

from __future__ import annotations

import numpy as np

from probe.monitor.detectors.noise_model import LEVELS, WINDOWS, cumulate, level_bins, peer_excess, row_median
from probe.monitor.detectors.step_matrix import MEMORY_COLUMNS, StepMatrix

#: A memory sample counts as a rise when it is this fraction of the level above the last one
#: (2 MB of 20 GB; and at least 1 MB): smaller changes are the allocator's rounding.
MEM_RISE = 1e-4

#: The job-wide series :func:`derive` keeps per step, in this order.
JOB_SERIES = ("step", "compute", "data loading", "communication", "comm_all")
#: Steps of a rank's turn at running slow (:func:`turn_medians`; the shortest k-of-n window).
TURN_STEPS = WINDOWS[0]


def capped_excess(x: np.ndarray) -> np.ndarray:
    """Log excesses ``x`` as excess fractions capped at +-100% (one hiccup is one slow step);
    -inf where ``x`` is NaN (a step not judged is no slow step).

    >>> capped_excess(np.log(np.array([1.5, 4.0, np.nan]))).tolist()
    [0.5, 1.0, -inf]
    """
    e = np.clip(np.expm1(x), -1.0, 1.0)
    return np.where(np.isnan(e), -np.inf, e)


def turn_medians(x: np.ndarray, new: int, w: int = TURN_STEPS) -> np.ndarray:
    """For each of the last ``new`` rows of the log excesses ``x`` (the rows before them are
    context), the median :func:`capped_excess` of the ``w`` rows ending there, per rank; -inf
    where fewer than ``w`` rows end there. Kept per row in the derived series (``own_turn``), so
    :func:`probe.monitor.detectors.timing.turns` takes the largest of them over its history instead
    of a median over every window of it at each judged step.

    >>> x = np.log(np.array([[1.0], [1.3], [1.3], [1.0], [1.3], [1.0]]))
    >>> turn_medians(x, 3).round(2).tolist()
    [[-inf], [0.3], [0.3]]
    """
    e = capped_excess(x)
    out = np.full((new,) + e.shape[1:], -np.inf)
    first = len(e) - new
    if len(e) >= w:
        windows = np.lib.stride_tricks.sliding_window_view(e, w, axis=0)   # [rows - w + 1, ranks, w]
        begin = max(first, w - 1)                                          # the first row with a whole window
        if begin < len(e):
            out[begin - first:] = np.partition(windows[begin - w + 1:], w // 2, axis=-1)[..., w // 2]
    return out


def traced_cells(m: StepMatrix) -> np.ndarray:
    return np.nan_to_num(m.col("traced"), nan=0.0) > 0


def own_work(m: StepMatrix, compute: str = "compute_time_ms") -> np.ndarray:
    """compute + data loading (or step time minus communication), NaN where traced."""
    compute, data = m.col(compute), m.col("data_time_ms")
    some = ~(np.isnan(compute) & np.isnan(data))
    work = np.where(some, np.nan_to_num(compute) + np.nan_to_num(data),
                    m.col("step_time_ms") - np.nan_to_num(m.col("comm_time_ms")))
    return np.where(traced_cells(m), np.nan, work)


def own_excess(m: StepMatrix, own: np.ndarray | None = None) -> np.ndarray:
    """:func:`peer_excess` of own work; where the ranks report their compute's CPU time too
    (``compute_cpu_ms``: CPU ranks), the smaller of the wall-time and the CPU-time excess.

    A rank whose core a neighbour holds (another process, a shared host) takes longer on the
    wall clock while its CPU time stays its peers': its own work did not grow, the machine
    slowed it, and a rank of a job on shared machines takes such turns. A rank with more work,
    or a slower processor, takes longer on both clocks. (Data loading stays wall time: waiting
    for data is its nature.) ``own``: :func:`own_work` of ``m`` when the caller has it.

    >>> m = StepMatrix(np.arange(1), np.arange(3), {
    ...     "compute_time_ms": np.array([[10.0, 10.0, 30.0]]),
    ...     "compute_cpu_ms": np.array([[9.0, 9.0, 9.5]])})
    >>> own_excess(m).round(2).tolist()
    [[-0.55, -0.55, 0.05]]
    """
    x, x_cpu = clock_excess(m, own)
    return x if x_cpu is None else np.where(np.isnan(x_cpu), x, np.minimum(x, x_cpu))


def clock_excess(m: StepMatrix, own: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`peer_excess` of own work on the wall clock, and on the CPU clock (compute's CPU
    time + data loading) where some rank reported ``compute_cpu_ms`` (else None)."""
    x = peer_excess(own_work(m) if own is None else own)
    cpu = m.cols.get("compute_cpu_ms")
    if cpu is None or np.isnan(cpu).all():               # GPU ranks, or a store's empty column
        return x, None
    # a CPU time that is no time (NaN, infinite, not above 0) is none: that cell keeps the wall
    return x, peer_excess(np.where(np.isfinite(cpu) & (cpu > 0), own_work(m, "compute_cpu_ms"),
                                   np.nan))


def derive(m: StepMatrix, start: int | None = None) -> dict[str, np.ndarray]:
    """The series the detectors read, for the rows from ``start`` on (the rows before are
    context); with ``start=None``, for every row not derived yet, stored in ``m.derived``.

    - ``x_own``, ``x_step``: :func:`own_excess` and :func:`peer_excess` of step time; traced cells
      NaN; near a trace (the step of one and the next), ``x_step`` NaN and ``x_own`` NaN unless
      three ranks are untraced; ``own_bins``, ``step_bins``: their :func:`level_bins`;
      ``own_turn``: :func:`turn_medians` of ``x_own`` (the rows before ``start`` as context);
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
    traced = traced_cells(sub)
    traced_steps = set(sub.steps[traced.any(axis=1)].tolist())
    disturbed = np.array([int(s) in traced_steps or int(s) - 1 in traced_steps
                          for s in sub.steps], dtype=bool)[skip:]
    own = own_work(sub)
    step = np.where(traced, np.nan, sub.col("step_time_ms"))[skip:]
    x_own = own_excess(sub, own)[skip:]
    own = own[skip:]
    x_own[disturbed & ((~np.isnan(own)).sum(axis=1) < 3)] = np.nan
    x_step = peer_excess(step)
    x_step[disturbed] = np.nan
    job = np.empty((len(step), len(JOB_SERIES)))
    for i, (key, how) in enumerate((("step_time_ms", "median"), ("compute_time_ms", "median"),
                                    ("data_time_ms", "median"), ("comm_time_ms", "min"),
                                    ("comm_time_ms", "median"))):
        job[:, i] = row_median(np.where(traced, np.nan, sub.col(key))[skip:], how)
    job[disturbed] = np.nan
    context = (m.derived["x_own"][max(0, start - TURN_STEPS + 1):start]
               if start > 0 and "x_own" in m.derived else x_own[:0])
    out = {"x_own": x_own, "x_step": x_step, "own_bins": level_bins(x_own, LEVELS),
           "step_bins": level_bins(x_step, LEVELS), "job": job,
           "own_turn": turn_medians(np.vstack([context, x_own]), len(x_own))}
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
