"""The service's detector thread: judges each job's newly complete steps and raises alerts.

Every ``interval_s`` the thread:

1. raises ``rank_lost`` for a rank (not finished) heard of no more in ``lost_after_s``;
2. for each job that ingested new points, finds its complete step (the last step every live
   rank has reported; a finished job's last step) and runs :func:`monitor.detectors.detect`
   on the steps from the last judged one up to it, over ``DETECT_HISTORY`` steps of history;
3. keeps an alert of a kind for a rank from repeating within ``ALERT_COOLDOWN_STEPS``; stores
   each alert, tells the watchers, and, where ``trace_on_alert`` names its kind, requests a
   deep trace of the rank it names (once per job, rank and kind).

After a restart it goes on from the store: steps already stored are not judged again, and
alerts already raised are not repeated.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from monitor import detectors
from monitor.ranks import RankRegistry
from monitor.storage import MonitorStore
from monitor.watchers import Watchers

#: Steps of history the detectors look back over.
DETECT_HISTORY = 25
#: An alert of the same kind for the same rank is not repeated within this many steps.
ALERT_COOLDOWN_STEPS = {"straggler": 50, "nonfinite": 20, "slow_step": 0}


class Detection:
    """The detector thread of one service; see the module docstring.

    ``request_trace(job, ranks, start, end, next_steps, reason)`` asks for a deep trace.
    """

    def __init__(self, store: MonitorStore, ranks: RankRegistry, watchers: Watchers, *,
                 lost_after_s: float, trace_on_alert: dict[str, int],
                 request_trace: Callable[..., Any], log: Callable[[str], None]) -> None:
        self.store, self.ranks, self.watchers = store, ranks, watchers
        self.lost_after_s = lost_after_s
        self.trace_on_alert = trace_on_alert
        self.request_trace = request_trace
        self.log = log
        self._dirty: set[str] = set()
        self._evaluated: dict[str, int] = {}
        self._last_alert_step: dict[tuple[str, str, int], int] = {}
        self._triggered: set[tuple[str, int, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for job, step in store.rows("SELECT job, max(step) FROM metrics GROUP BY job"):
            self._evaluated[job] = -1 if step is None else int(step)
        for job, kind, rank, step in store.rows(
                "SELECT job, kind, rank, max(step) FROM alerts GROUP BY job, kind, rank"):
            self._last_alert_step[(job, kind, rank)] = -1 if step is None else int(step)

    def start(self, interval_s: float) -> None:
        """Start the detector thread, judging every ``interval_s`` seconds."""
        self._thread = threading.Thread(target=self._loop, args=(interval_s,),
                                        name="monitor-detect", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the detector thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def mark(self, job: str) -> None:
        """``job`` has new points (or a rank finished): judge it on the next round."""
        self._dirty.add(job)

    def judged_step(self, job: str) -> int:
        """The detectors have judged the steps of ``job`` up to this one (-1: none)."""
        return self._evaluated.get(job, -1)

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.detect_once()
            except Exception as e:  # noqa: BLE001 - detection must never stop ingest
                self.watchers.broadcast({"type": "error", "message": f"detector failed: {e}"})

    def detect_once(self) -> list[dict[str, Any]]:
        """Run the detectors on every job's newly complete steps; returns the new alerts."""
        now = time.time()
        raised: list[dict[str, Any]] = []
        states = self.ranks.states()
        for st in states:
            if (not st.final and not st.lost_alerted and st.last_seen
                    and now - st.last_seen > self.lost_after_s):
                st.lost_alerted = True
                raised.append(self._raise({
                    "kind": "rank_lost", "job": st.job, "rank": st.rank, "step": st.last_step,
                    "message": f"rank {st.rank} has sent nothing for {now - st.last_seen:.0f} s "
                               f"(last step {st.last_step})",
                    "evidence": {"last_seen_s": now - st.last_seen, "last_step": st.last_step,
                                 "host": st.host, "pid": st.pid}}))
        jobs = set(self._dirty)
        self._dirty.difference_update(jobs)
        for job in jobs:
            live = [s for s in states if s.job == job and s.last_step >= 0
                    and (s.final or now - s.last_seen <= self.lost_after_s)]
            if not live:
                continue
            running = [s.last_step for s in live if not s.final]
            complete = min(running) if running else max(s.last_step for s in live)
            done = self._evaluated.get(job, -1)
            if complete <= done:
                continue
            table = self.store.step_table(job, max(0, done + 1 - DETECT_HISTORY))
            found = detectors.detect(table, range(done + 1, complete + 1), job=job)
            self._evaluated[job] = complete
            for alert in found:
                key = (job, alert["kind"], alert["rank"])
                cooldown = ALERT_COOLDOWN_STEPS.get(alert["kind"], 0)
                last = self._last_alert_step.get(key)
                if last is not None and (alert["step"] - last <= cooldown if cooldown else
                                         alert["step"] == last):
                    continue
                self._last_alert_step[key] = alert["step"]
                raised.append(self._raise(alert))
        return raised

    def _raise(self, alert: dict[str, Any]) -> dict[str, Any]:
        alert = self.store.add_alert(alert)
        self.log(f"alert #{alert['id']} {alert['kind']} job {alert['job']}: {alert['message']}")
        self.watchers.broadcast(dict(alert, type="alert"))
        n = self.trace_on_alert.get(alert["kind"])
        key = (alert["job"], alert["rank"], alert["kind"])
        if n and alert.get("rank") is not None and key not in self._triggered:
            self._triggered.add(key)
            self.request_trace(alert["job"], [alert["rank"]], -1, -1, n,
                               f"alert {alert['id']} ({alert['kind']})")
        return alert
