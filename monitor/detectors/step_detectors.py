"""Detectors: pure functions over per-(rank, step) series that return alerts with evidence.

The input is a :class:`StepMatrix` (or anything :meth:`StepMatrix.of` takes: the table
:meth:`probe.monitor.service.storage.MonitorStore.step_table` returns, any Arrow table or list of
dicts with ``rank``, ``step`` and some of ``step_time_ms``, ``compute_time_ms``, ``compute_cpu_ms``,
``comm_time_ms``, ``data_time_ms``, ``loss``, ``grad_norm``, ``nonfinite_grads``, ``device_mem_mb``,
``proc_rss_mb``, ``traced``). Each detector judges the steps in ``steps`` (all when ``None``) and
uses the rest of the matrix as history. An alert is a dict: ``kind``, ``job``, ``rank``, ``step``,
``message`` (the evidence in words) and ``evidence`` (the numbers behind it).

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
   Where the ranks report their compute's CPU time (``compute_cpu_ms``, CPU ranks), own work
   is judged on both clocks and the smaller excess counts: a neighbour holding a rank's core
   stretches its wall time only (:func:`probe.monitor.detectors.step_series.own_excess`).
3. **Noise measured on this job.** For each deviation level ``theta`` in :data:`LEVELS` the
   detector counts how often the *other* ranks (leave-one-out; for the job-wide series, the
   job's own earlier steps) exceed it, over the last :data:`HISTORY` steps, and how often such
   an excess runs on into the next step: ``p = (exceedances + 1) / (samples + 2)`` (few
   samples: high ``p``, so a young job needs more evidence) and ``p11``, the chance an excess
   continues, shrunk towards ``p`` (bursts, such as a shared-core neighbour, make ``p11 > p``).
   Both are then taken :data:`NOISE_SE` standard errors higher (:func:`upper`): measured on
   few samples (two ranks, one peer; a young job; few bursts seen) a rate is uncertain, and a
   run is judged against the noise the job may well have, not the one it happened to show
   (on two ranks sharing a loaded machine, a rank ran 2-3x its peer for eleven steps, or
   1.2x for thirty, after a hundred steps with no such run).
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
   :data:`MIN_EXCESS` (15%) over its window, and more than any other rank's deepest turn at
   running slow in the history (:func:`turns`: its largest median excess over five steps): a
   slowdown that moves between ranks is the machine's noise, not a straggler.

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
[('straggler', 2, 6, 'compute')]
"""

from __future__ import annotations

from typing import Any, Iterable

from probe.monitor.detectors.hang import (HANG_MIN_S, HANG_START_S, HANG_STEP_FACTOR, P2P_OPS,
                                          REPORT_GRACE_S, hang_threshold_s, hangs)
from probe.monitor.detectors.health import MEM_MIN_GROWTH, memory_growth, nonfinite
from probe.monitor.detectors.noise_model import (ALPHA, HISTORY, LEVELS, NOISE_SE, OWN_PRIOR,
                                                 RUN_PRIOR, WINDOWS, Verdict, cumulate, level_bins,
                                                 peer_excess, persistent, row_median, run_chance,
                                                 run_rate, upper)
from probe.monitor.detectors.step_matrix import (CHECKED_COLUMNS, MEMORY_COLUMNS, TIMING_COLUMNS,
                                                 Alert, StepMatrix)
from probe.monitor.detectors.step_series import JOB_SERIES, MEM_RISE, derive
from probe.monitor.detectors.timing import (BASELINE, JOB_LEVELS, JOB_WINDOWS, MIN_BASELINE,
                                            MIN_EXCESS, slow_steps, stragglers, turns)

__all__ = ["ALPHA", "BASELINE", "CHECKED_COLUMNS", "HANG_MIN_S", "HANG_START_S",
           "HANG_STEP_FACTOR", "HISTORY", "JOB_LEVELS", "JOB_SERIES", "JOB_WINDOWS", "LEVELS",
           "MEMORY_COLUMNS", "MEM_MIN_GROWTH", "MEM_RISE", "MIN_BASELINE", "MIN_EXCESS",
           "NOISE_SE", "OWN_PRIOR", "P2P_OPS", "REPORT_GRACE_S", "RUN_PRIOR", "TIMING_COLUMNS",
           "WINDOWS",
           "Alert", "StepMatrix", "Verdict", "cumulate", "derive", "detect", "hang_threshold_s",
           "hangs", "level_bins", "memory_growth", "nonfinite", "peer_excess", "persistent",
           "row_median", "run_chance", "run_rate", "slow_steps", "stragglers", "turns", "upper"]


def detect(table: Any, steps: Iterable[int] | None = None, *, job: str | None = None) -> list[Alert]:
    """All step detectors over one matrix: non-finite values, stragglers, slow steps, memory."""
    m = StepMatrix.of(table, job)
    steps = None if steps is None else list(steps)
    return (nonfinite(m, steps, job=job) + stragglers(m, steps, job=job)
            + slow_steps(m, steps, job=job) + memory_growth(m, steps, job=job))
