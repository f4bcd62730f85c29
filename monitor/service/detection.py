"""The service's detector thread: judges each job's newly complete steps, watches for hangs,
and keeps one alert open per cause, updated in place.

Every ``interval_s`` the thread:

1. raises ``rank_lost`` for a rank (not finished) heard of no more in ``lost_after_s``;
2. for each job that ingested new points, finds its complete step (the last step every live rank,
   registered and not lost, has reported; a finished job's last step), reads the steps from the last
   judged one up to it from the store (only those, as points), appends them to the job's
   :class:`JobWindow` (the last :data:`WINDOW_STEPS` steps, whose derived series are computed once
   per step) and runs the detectors of :mod:`probe.monitor.detectors.step_detectors` on each new
   step; the same steps' per-module ``numerics:*`` points (:mod:`probe.monitor.numerics_names`),
   when the job sends them, join its
   :class:`~probe.monitor.detectors.numerics_window.NumericsWindow` and the detectors of
   :mod:`probe.monitor.detectors.numerics` judge them;
3. checks every running job for a hang: from each rank's last report of the collective it is in
   (:mod:`probe.monitor.service.ranks`), with a threshold from the job's own step times
   (:func:`probe.monitor.detectors.step_detectors.hang_threshold_s`); a hang alert names the rank(s)
   that never entered the collective the others wait in, and it is resolved when they move again;
4. merges what it found into the open alerts (:class:`AlertBook`): one open alert per cause
   (kind and rank; for a hang, the collective; for numerics, the module and quantity),
   whose ``count`` and ``last_step`` grow while the cause recurs; a cause absent for
   :data:`CLOSE_AFTER_STEPS` judged steps is closed, and a later recurrence opens a new
   alert. A new alert is stored, told to the watchers and, where
   ``trace_on_alert`` names its kind, triggers a deep trace of its rank (once per job, rank and
   kind); an updated one is stored again and told as ``alert_update``. A new hang alert, with
   ``stacks_on_hang``, asks every rank of the job to dump its Python stacks.

After a restart it goes on from the store: steps already stored are not judged again, and
alerts still open are updated rather than raised again.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


from probe.monitor.detectors import step_detectors
from probe.monitor.detectors.job_window import WINDOW_STEPS, JobWindow
from probe.monitor.detectors.module_matrix import ModuleMatrix
from probe.monitor.detectors.numerics_window import NumericsWindow
from probe.monitor.detectors.step_detectors import StepMatrix
from probe.monitor.service.ranks import RankRegistry
from probe.monitor.service.storage import MonitorStore
from probe.monitor.service.watchers import Watchers

#: An open alert whose cause has not recurred for this many judged steps is closed.
CLOSE_AFTER_STEPS = 50


def alert_key(alert: dict[str, Any]) -> tuple:
    """The cause an alert is about: its kind and rank; for a hang, the collective; for a
    numerics alert its module and quantity (whatever ranks show it)."""
    if alert["kind"].startswith("numerics_"):
        ev = alert.get("evidence") or {}
        return (alert["job"], alert["kind"], alert.get("module") or ev.get("module"),
                alert.get("quantity") or ev.get("quantity"))
    if alert["kind"] == "hang":
        ev = alert.get("evidence") or {}
        return (alert["job"], "hang", f"{ev.get('group')}#{ev.get('seq')}")
    return (alert["job"], alert["kind"], alert.get("rank"))


class AlertBook:
    """Open alerts by cause, merged in place (see the module docstring, step 4).

    >>> book = AlertBook()
    >>> a = {"kind": "straggler", "job": "j", "rank": 3, "step": 10, "message": "m", "evidence": {}}
    >>> book.merge(a)[1], book.merge(dict(a, step=11))[1], book.merge(dict(a, step=11))[0]["count"]
    (True, False, 2)
    >>> book.merge(dict(a, step=200))[1]                     # long gone: a new alert
    True
    """

    def __init__(self, close_after: int = CLOSE_AFTER_STEPS) -> None:
        self.close_after = close_after
        self.open: dict[tuple, dict[str, Any]] = {}

    def load(self, alert: dict[str, Any]) -> None:
        """Take an alert still open in the store (after a restart)."""
        alert = dict(alert, count=alert.get("count") or 1,
                     last_step=alert.get("last_step") if alert.get("last_step") is not None
                     else alert.get("step"))
        self.open[alert_key(alert)] = alert

    def merge(self, alert: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """``(the open alert, True when it is new)``: a recurrence updates the open one (count,
        last step, message, evidence); a cause closed (or never seen) opens a new one."""
        key = alert_key(alert)
        step = alert.get("step")
        old = self.open.get(key)
        stale = (old is not None and step is not None and old.get("last_step") is not None
                 and step - old["last_step"] > self.close_after)
        if old is None or stale or old.get("state") == "closed":
            new = dict(alert, count=1, last_step=step, state="open")
            self.open[key] = new
            return new, True
        if step is not None and old.get("last_step") is not None and step <= old["last_step"] \
                and alert["kind"] != "hang":
            return old, False                      # this step was counted already
        old.update(message=alert["message"], evidence=alert.get("evidence", {}),
                   count=old["count"] + 1,
                   last_step=step if step is not None else old.get("last_step"))
        return old, False

    def close(self, key: tuple) -> dict[str, Any] | None:
        """Close the open alert of ``key``; returns it (None when none is open)."""
        old = self.open.get(key)
        if old is None or old.get("state") == "closed":
            return None
        old["state"] = "closed"
        return old

    def expire(self, job: str, step: int) -> list[dict[str, Any]]:
        """Close the step alerts of ``job`` not seen for ``close_after`` steps before ``step``."""
        closed = []
        for key, a in self.open.items():
            if (key[0] == job and a["kind"] != "hang" and a.get("state") == "open"
                    and a.get("last_step") is not None and step - a["last_step"] > self.close_after):
                a["state"] = "closed"
                closed.append(a)
        return closed


class Detection:
    """The detector thread of one service; see the module docstring.

    ``request_trace(job, ranks, start, end, next_steps, reason)`` asks for a deep trace;
    ``dump_stacks(job, request_id)`` asks every rank of a job to dump its Python stacks.
    """

    def __init__(self, store: MonitorStore, ranks: RankRegistry, watchers: Watchers, *,
                 lost_after_s: float, trace_on_alert: dict[str, int],
                 request_trace: Callable[..., Any], log: Callable[[str], None],
                 dump_stacks: Callable[[str, str], Any] | None = None) -> None:
        self.store, self.ranks, self.watchers = store, ranks, watchers
        self.lost_after_s = lost_after_s
        self.trace_on_alert = trace_on_alert
        self.request_trace = request_trace
        self.dump_stacks = dump_stacks
        self.log = log
        self.book = AlertBook()
        self.windows: dict[str, JobWindow] = {}
        self.numerics: dict[str, NumericsWindow] = {}
        self.numerics_seconds = 0.0              # of detect_seconds: the numerics detectors'
        self.detect_seconds = 0.0                # time spent judging steps (not hangs)
        self.judged_steps = 0
        self._dirty: set[str] = set()
        self._evaluated: dict[str, int] = {}
        self._triggered: set[tuple[str, int, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for job, step in store.rows("SELECT job, max(step) FROM metrics GROUP BY job"):
            self._evaluated[job] = -1 if step is None else int(step)
        for alert in store.open_alerts():
            self.book.load(alert)

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

    def open_hang(self, job: str) -> dict[str, Any] | None:
        """The open hang alert of ``job``, if any."""
        for key, a in list(self.book.open.items()):     # read from the service's threads too
            if key[0] == job and key[1] == "hang" and a.get("state") == "open":
                return a
        return None

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.detect_once()
            except Exception as e:  # noqa: BLE001 - detection must never stop ingest
                self.log(f"detector failed: {type(e).__name__}: {e}")
                self.watchers.broadcast({"type": "error", "message": f"detector failed: {e}"})

    def detect_once(self) -> list[dict[str, Any]]:
        """Run the detectors on every job's newly complete steps and check for hangs now;
        returns the alerts opened (new, not the updated ones)."""
        now = time.time()
        raised: list[dict[str, Any]] = []
        states = self.ranks.states()
        for st in states:
            if (not st.final and not st.lost_alerted and st.last_seen
                    and now - st.last_seen > self.lost_after_s):
                st.lost_alerted = True
                raised += self._found([{
                    "kind": "rank_lost", "job": st.job, "rank": st.rank, "step": st.last_step,
                    "message": f"rank {st.rank} has sent nothing for {now - st.last_seen:.0f} s "
                               f"(last step {st.last_step})",
                    "evidence": {"last_seen_s": now - st.last_seen, "last_step": st.last_step,
                                 "host": st.host, "pid": st.pid}}])
        jobs = set(self._dirty)
        self._dirty.difference_update(jobs)
        for job in sorted(jobs):
            raised += self._judge_job(job, [s for s in states if s.job == job], now)
        for job in sorted({s.job for s in states}):
            raised += self._check_hang(job, [s for s in states if s.job == job], now)
        return raised

    def _judge_job(self, job: str, states: list, now: float) -> list[dict[str, Any]]:
        # a rank registered but silent yet holds the job back (its steps are to come); a lost
        # one does not
        live = [s for s in states if s.final or now - s.last_seen <= self.lost_after_s]
        if not any(s.last_step >= 0 for s in live):
            return []
        running = [s.last_step for s in live if not s.final]
        complete = min(running) if running else max(s.last_step for s in live)
        done = self._evaluated.get(job, -1)
        if complete <= done:
            return []
        t0 = time.perf_counter()
        window = self.windows.get(job)
        since = done + 1
        if window is None:                        # a new job, or one met again after a restart
            window = self.windows[job] = JobWindow(job)
            since = max(0, done + 1 - WINDOW_STEPS)
        window.append(StepMatrix.from_points(self.store.step_points(job, since, complete), job))
        found = window.judge(range(done + 1, complete + 1))
        found += self._judge_numerics(job, done, complete)
        self.detect_seconds += time.perf_counter() - t0
        self.judged_steps += complete - done
        raised = self._found(found)
        for closed in self.book.expire(job, complete):
            self.store.update_alert(closed)
        # judged once its alerts are stored: whoever waits for the step (judged_step) then
        # reads them, the updates of open ones included
        self._evaluated[job] = complete
        return raised

    def _judge_numerics(self, job: str, done: int, complete: int) -> list[dict[str, Any]]:
        """The numerics detectors on the steps ``done+1..complete`` of ``job``: its
        ``numerics:*`` points of those steps (at most a window's worth; a new window also reads
        the window's history before them) join the job's :class:`NumericsWindow`."""
        window = self.numerics.get(job)
        if window is None and job not in self.store.numerics_jobs:
            return []                             # it never sent any: no query a step
        t0 = time.perf_counter()
        since = max(done + 1, complete - WINDOW_STEPS + 1)
        if window is None:                        # a new job, or one met again after a restart
            since = max(0, complete - WINDOW_STEPS + 1)
        try:
            points = self.store.numerics_points(job, since, complete)
            if not points.num_rows:
                return []
            if window is None:
                window = self.numerics[job] = NumericsWindow(job)
            window.append(ModuleMatrix.from_points(points, job))
            return window.judge(range(done + 1, complete + 1))
        except Exception as e:  # noqa: BLE001 - never in the way of the step detectors
            self.numerics.pop(job, None)
            self.log(f"numerics detectors failed on job {job}: {type(e).__name__}: {e}")
            return []
        finally:
            self.numerics_seconds += time.perf_counter() - t0

    def _check_hang(self, job: str, states: list, now: float) -> list[dict[str, Any]]:
        if not any(s.pending for s in states) and self.open_hang(job) is None:
            return []
        reports = [s.collective_report(now) for s in states]
        window = self.windows.get(job)
        threshold = step_detectors.hang_threshold_s(window.step_times() if window else [])
        world = max([s.world_size for s in states] + [len(states)])
        found = step_detectors.hangs(reports, threshold_s=threshold, job=job, world=range(world))
        keys = {alert_key(a) for a in found}
        for key, a in list(self.book.open.items()):
            if key[0] == job and key[1] == "hang" and key not in keys and a.get("state") == "open":
                # stored closed before the book closes it: whoever sees the hang resolved (the
                # status reads the book) finds it closed in the store too
                message = a["message"].split(" [resolved")[0] + " [resolved: the ranks moved on]"
                self.store.update_alert(dict(a, state="closed", message=message))
                a["message"] = message
                self.book.close(key)
                self.watchers.broadcast(dict(a, type="alert_update"))
        return self._found(found)

    def _found(self, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Merge ``found`` into the open alerts; store, tell and act on the new ones."""
        raised, updated = [], {}
        for alert in found:
            merged, new = self.book.merge(alert)
            if new:
                raised.append(self._raise(merged))
            else:
                updated[id(merged)] = merged
        for a in updated.values():
            self.store.update_alert(a)
            self.watchers.broadcast(dict(a, type="alert_update"))
        return raised

    def _raise(self, alert: dict[str, Any]) -> dict[str, Any]:
        stored = self.store.add_alert(alert)
        alert.update(id=stored["id"], time_ns=stored["time_ns"])
        self.log(f"alert #{alert['id']} {alert['kind']} job {alert['job']}: {alert['message']}")
        if alert["kind"] == "hang" and self.dump_stacks is not None:
            request = f"stacks-{alert['id']}"
            try:
                self.dump_stacks(alert["job"], request)
                alert["evidence"] = dict(alert.get("evidence") or {}, stacks=request)
                alert["message"] += (f" [Python stacks of every rank: probe monitor trace-files "
                                     f"--trace {request}]")
                self.store.update_alert(alert)
            except ValueError as e:
                self.log(f"cannot ask for stacks: {e}")
        self.watchers.broadcast(dict(alert, type="alert"))
        n = self.trace_on_alert.get(alert["kind"])
        key = (alert["job"], alert["rank"], alert["kind"])
        if n and alert.get("rank") is not None and key not in self._triggered:
            self._triggered.add(key)
            self.request_trace(alert["job"], [alert["rank"]], -1, -1, n,
                               f"alert {alert['id']} ({alert['kind']})")
        return alert
