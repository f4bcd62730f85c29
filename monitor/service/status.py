"""The status document: every job's ranks with their health, recent alerts, and traces.

A rank's health, from what the service heard of it (its batches and heartbeats):

1. ``finished``: its last batch said so (or, for a rank of an earlier session, the store);
2. ``lost``: nothing heard for more than ``lost_after_s`` (or never);
3. ``stale``: nothing for more than ``STALE_AFTER_S`` (at most half of ``lost_after_s``);
4. ``ok`` otherwise.

A job is ``finished`` when all its ranks are, ``degraded`` when one is lost or stale,
``hung`` while a hang alert is open, else ``ok``; ``judged_step`` is the last step the
detectors have judged, and ``hang`` the open hang alert (None when there is none: its
``message`` names the rank(s) that never entered the collective the others wait in). A rank
that reports its collectives has ``step_in`` (the step it is in) and ``collective`` (the one
it has entered and not left: op, seq, group, bytes, waiting_s now; None when in none).

Each alert carries ``count`` (the steps, or checks, at which its cause was seen), ``step``
(the first) and ``last_step``, and ``state``: open, or closed once its cause went away.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from probe.monitor.service.ranks import RankRegistry
from probe.monitor.service.storage import MonitorStore

#: Seconds without a batch or heartbeat after which a rank is "stale" (then "lost").
STALE_AFTER_S = 5.0
#: Recent alerts in one document, at most.
STATUS_ALERTS = 200


def status_document(store: MonitorStore, ranks: RankRegistry, job: str | None, *,
                    lost_after_s: float, judged_step: Callable[[str], int],
                    service: dict[str, Any],
                    open_hang: Callable[[str], dict[str, Any] | None] = lambda job: None,
                    ) -> dict[str, Any]:
    """``{"service": service, "jobs": [...], "alerts": [...], "traces": [...]}`` for ``job``
    (every job when None); see the module docstring."""
    now = time.time()
    jobs: dict[str, dict[str, Any]] = {}
    for row in store.job_summary():
        if job and row["job"] != job:
            continue
        st = ranks.get(row["job"], row["rank"])
        last_seen = max(st.last_seen if st else 0.0, (row["last_time_ns"] or 0) / 1e9)
        age = now - last_seen if last_seen else None
        if (st.final if st is not None and st.agent_id else row["finished_ns"] is not None):
            health = "finished"
        elif age is None or age > lost_after_s:
            health = "lost"
        elif age > min(STALE_AFTER_S, lost_after_s / 2):
            health = "stale"
        else:
            health = "ok"
        last_step = max(st.last_step if st else -1,
                        row["last_step"] if row["last_step"] is not None else -1)
        j = jobs.setdefault(row["job"], {"job": row["job"], "world_size": 0, "ranks": []})
        j["world_size"] = max(j["world_size"], row["world_size"] or 0, row["rank"] + 1)
        j["ranks"].append({
            "rank": row["rank"], "host": row["host"], "pid": row["pid"],
            "engine": row["engine"], "health": health, "last_step": last_step,
            "last_seen_s": None if age is None else round(age, 3),
            "points": int(row["points"]), "batches": int(row["batches"]),
            "dropped": int(row["dropped"]), "registrations": row["registrations"] or 0,
            "connected": bool(st and st.connected),
            "step_in": st.step_in if st is not None else -1,
            "collective": st.collective_report(now)["pending"] if st is not None else None,
        })
    alerts = []
    for a in store.alerts(job).to_pylist()[-STATUS_ALERTS:]:
        a["evidence"] = json.loads(a["evidence"] or "{}")
        alerts.append(a)
    by_job: dict[str, dict[str, int]] = {}
    for a in alerts:
        counts = by_job.setdefault(a["job"], {})
        counts[a["kind"]] = counts.get(a["kind"], 0) + 1
    for j in jobs.values():
        steps = [r["last_step"] for r in j["ranks"]]
        j["last_step"] = max(steps) if steps else -1
        healths = {r["health"] for r in j["ranks"]}
        hang = open_hang(j["job"])
        j["hang"] = None if hang is None else {
            k: hang.get(k) for k in ("id", "rank", "step", "message", "evidence", "count")}
        j["health"] = ("finished" if healths == {"finished"} else "hung" if hang else
                       "degraded" if healths & {"lost", "stale"} else "ok")
        j["alerts"] = by_job.get(j["job"], {})
        j["judged_step"] = judged_step(j["job"])   # detectors have seen steps <= this
    return {"service": service, "jobs": sorted(jobs.values(), key=lambda j: j["job"]),
            "alerts": alerts, "traces": store.traces(job).to_pylist()}
