"""What the live cluster page shows of a running job: per-rank series, a summary row per rank,
the alerts grouped, and the ones still open.

Inputs are plain rows: metric points (``rank``, ``step``, ``name``, ``value``, as
``monitor.client.MonitorClient.metrics`` and the record store's ``metrics`` view give them) and
alerts (``kind``, ``rank``, ``step``, ``message``, and where the monitor keeps one alert per
cause: ``count``, ``last_step``, ``state``). Which rank is a straggler is the monitor's
detectors' call (its ``straggler`` alerts); these functions only lay it out.

>>> pts = [{"rank": r, "step": s, "name": "compute_time_ms", "value": 30.0 if r else 10.0}
...        for r in (0, 1) for s in range(3)]
>>> alert = {"kind": "straggler", "rank": 1, "step": 2, "message": "rank 1 computes 3x"}
>>> [(row["rank"], row["straggler"], row["ratio"]) for row in rank_summary(series(pts), [alert])]
[(1, True, 3.0), (0, False, 0.3333333333333333)]
"""

from __future__ import annotations

from statistics import median
from typing import Any, Iterable, Mapping

#: The alert kinds a rank's summary row marks.
STRAGGLER, NONFINITE = "straggler", "nonfinite"
#: Steps an alert without a state counts as open after its last step.
OPEN_FOR_STEPS = 20

Series = dict[str, dict[int, dict[int, float]]]


def series(points: Iterable[Mapping[str, Any]]) -> Series:
    """Points regrouped as name -> rank -> step -> value (the last value wins), with the
    communication share (``comm_share`` = comm time / step time) where both are known."""
    out: Series = {}
    for p in points:
        if p.get("value") is None or p.get("step") is None:
            continue
        out.setdefault(p["name"], {}).setdefault(int(p["rank"]), {})[int(p["step"])] = float(p["value"])
    comm, step = out.get("comm_time_ms"), out.get("step_time_ms")
    if comm and step and "comm_share" not in out:
        out["comm_share"] = {r: {s: comm[r][s] / step[r][s] for s in comm[r] if step.get(r, {}).get(s)}
                             for r in comm}
    return out


def last_steps(data: Series) -> dict[int, int]:
    """The last step each rank reported (any metric)."""
    out: dict[int, int] = {}
    for per in data.values():
        for rank, steps in per.items():
            if steps:
                out[rank] = max(out.get(rank, -1), max(steps))
    return out


def is_open(alert: Mapping[str, Any], last_step: int | None, window: int = OPEN_FOR_STEPS) -> bool:
    """Whether an alert is still open: its ``state`` says so, or, with no state, its cause was
    seen within the last ``window`` steps."""
    if alert.get("state"):
        return alert["state"] == "open"
    seen = alert.get("last_step") if alert.get("last_step") is not None else alert.get("step")
    return last_step is None or seen is None or seen >= last_step - window


def open_alerts(alerts: Iterable[Mapping[str, Any]], last_step: int | None,
                urgency: Mapping[str, int]) -> list[dict[str, Any]]:
    """The open alerts of every kind, the latest per (kind, rank), most urgent first (``urgency``:
    kind -> rank of urgency, 0 the most urgent; a kind it lacks comes last)."""
    latest: dict[tuple, dict[str, Any]] = {}
    for a in alerts:
        if is_open(a, last_step):
            latest[(a.get("kind", ""), a.get("rank"))] = dict(a)
    return sorted(latest.values(),
                  key=lambda a: (urgency.get(a["kind"], len(urgency)), a.get("rank") or 0))


def alert_groups(alerts: Iterable[Mapping[str, Any]], last_step: int | None,
                 urgency: Mapping[str, int]) -> list[dict[str, Any]]:
    """Alerts counted per (kind, rank): count, first and last step, the latest message, and
    whether one is open; open first, then by ``urgency`` (as :func:`open_alerts`) and count."""
    groups: dict[tuple, dict[str, Any]] = {}
    for a in alerts:
        key = (a.get("kind", ""), a.get("rank"))
        g = groups.setdefault(key, {"kind": key[0], "rank": key[1], "count": 0, "first_step": None,
                                    "last_step": None, "message": "", "open": False})
        g["count"] += int(a.get("count") or 1)
        first = a.get("step")
        last = a.get("last_step") if a.get("last_step") is not None else first
        if first is not None and (g["first_step"] is None or first < g["first_step"]):
            g["first_step"] = first
        if last is not None and (g["last_step"] is None or last >= g["last_step"]):
            g["last_step"], g["message"] = last, a.get("message", "")
        elif not g["message"]:
            g["message"] = a.get("message", "")
        g["open"] = g["open"] or is_open(a, last_step)
    return sorted(groups.values(), key=lambda g: (not g["open"], urgency.get(g["kind"], len(urgency)), -g["count"],
                                                  g["rank"] if g["rank"] is not None else -1))


def rank_summary(data: Series, alerts: Iterable[Mapping[str, Any]] = (), health: Mapping[int, str] | None = None,
                 window: int = OPEN_FOR_STEPS) -> list[dict[str, Any]]:
    """One row per rank over the last ``window`` steps: its own compute time (median), its
    peers' (the median of the other ranks' medians), their ratio, its communication share, its
    last step, its health, and whether an open straggler or NaN/Inf alert names it; the
    straggler first, then the slowest."""
    last = last_steps(data)
    newest = max(last.values(), default=None)
    since = newest - window + 1 if newest is not None else 0

    def recent(name: str, rank: int) -> list[float]:
        return [v for s, v in data.get(name, {}).get(rank, {}).items() if s >= since]

    own = {r: median(v) for r in last if (v := recent("compute_time_ms", r))}
    flagged = {(a.get("kind"), a.get("rank")) for a in alerts if is_open(a, newest)}
    rows = []
    for rank in sorted(last):
        peers = [own[p] for p in own if p != rank]
        compute = own.get(rank)
        peer = median(peers) if peers else None
        share = recent("comm_share", rank)
        rows.append({"rank": rank, "compute_ms": compute, "peer_ms": peer,
                     "ratio": compute / peer if compute is not None and peer else None,
                     "comm_share": median(share) if share else None, "last_step": last[rank],
                     "health": (health or {}).get(rank, ""), "straggler": (STRAGGLER, rank) in flagged,
                     "nan": (NONFINITE, rank) in flagged})
    return sorted(rows, key=lambda r: (not r["straggler"], not r["nan"],
                                       -(r["ratio"] if r["ratio"] is not None else 0.0), r["rank"]))


def complete_steps(data: Series, name: str, after: int) -> tuple[list[int], list[list[float | None]]]:
    """The steps after ``after`` that every rank has reported ``name`` for, and the values per
    step, one per rank in rank order (a heat map's new columns)."""
    per = data.get(name, {})
    if not per:
        return [], []
    upto = min(max(steps) for steps in per.values() if steps) if all(per.values()) else after
    ranks = sorted(per)
    steps = sorted({s for r in ranks for s in per[r] if after < s <= upto})
    return steps, [[per[r].get(s) for r in ranks] for s in steps]
