"""Hang detection: from each rank's report of the collective it is in, the ranks of a group
stopped in a collective that some rank never entered (or that does not complete)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from probe.monitor.detectors.step_matrix import Alert

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
    # every rank in a collective, by (group, seq); a collective is stuck when one of them has
    # waited in it longer than the threshold (the others in it entered later: they wait too)
    inside: dict[tuple[str, int], list[int]] = {}
    long_waits: set[tuple[str, int]] = set()
    for rank, r in sorted(by_rank.items()):
        p = r.get("pending")
        if p and not r.get("final") and p.get("op") not in P2P_OPS:
            key = (p.get("group") or "world", int(p["seq"]))
            inside.setdefault(key, []).append(rank)
            if float(p.get("waiting_s") or 0.0) > threshold_s:
                long_waits.add(key)
    stuck = {key: inside[key] for key in long_waits}
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
