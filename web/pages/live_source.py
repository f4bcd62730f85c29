"""Where the live cluster page reads a job's metrics and alerts, and sends trace requests: the
monitor service (``monitor.client``) when the dashboard was given ``--monitor``, else the record
stores of the given run directories (``collectors.store``).

>>> LiveSource(store_dirs=("runs/demo",)).metrics(since_step=10)[:1]      # doctest: +SKIP
[{'job': 'demo', 'rank': 0, 'step': 10, 'name': 'step_time_ms', 'value': 41.2}]
"""

from __future__ import annotations

from typing import Any, Iterator

from probe.ground.errors import ProbeError
from probe.monitor.numerics_names import PREFIX as NUMERICS_PREFIX
from probe.monitor.numerics_names import metric_name, parse_metric_name
from probe.visualizer.pairs import records

#: Every metric the live page draws (the communication share is derived from two of them).
METRIC_NAMES = ("step_time_ms", "compute_time_ms", "tokens_per_s", "mfu", "hfu", "device_mem_mb",
                "proc_rss_mb", "comm_time_ms", "data_time_ms")


class LiveSource:
    """Where the live page reads metrics and alerts, and sends trace requests."""

    def __init__(self, monitor_addr: str | None = None, store_dirs: tuple[str, ...] = (),
                 job: str | None = None, token: str | None = None) -> None:
        self.monitor_addr = monitor_addr
        self.store_dirs = tuple(store_dirs)
        self.job = job
        self.token = token
        self._client: Any = None

    @property
    def available(self) -> bool:
        return bool(self.monitor_addr or self.store_dirs)

    def client(self) -> Any:
        if self._client is None:
            from probe.monitor.client import MonitorClient

            self._client = MonitorClient(self.monitor_addr, token=self.token)
        return self._client

    def current_job(self) -> str | None:
        """The ``job`` given, else the job the monitor heard from most recently."""
        if self.job or not self.monitor_addr:
            return self.job
        jobs = self.client().status().get("jobs") or []

        def age(j: dict) -> float:
            seen = [r["last_seen_s"] for r in j.get("ranks", []) if r.get("last_seen_s") is not None]
            return min(seen) if seen else float("inf")
        return min(jobs, key=age)["job"] if jobs else None

    def metrics(self, since_step: int = 0, job: str | None = None) -> list[dict[str, Any]]:
        """The charted metric points (job, rank, step, name, value) of the followed job (or
        ``job``), from ``since_step`` on."""
        if self.monitor_addr:
            job = job or self.current_job()
            return records(self.client().metrics(job=job, since_step=since_step, names=METRIC_NAMES)) if job else []
        import duckdb

        from probe.collectors.store import open_store

        out = []
        names = ", ".join(f"'{n}'" for n in METRIC_NAMES)
        for d in self.store_dirs:
            try:
                con = open_store(d)
            except ProbeError:
                continue            # the run has not written its first segment yet
            try:
                sql = f"select job, rank, step, name, value from metrics where name in ({names}) and step >= ?"
                if self.job:
                    rows = con.execute(sql + " and job = ?", [since_step, self.job]).fetchall()
                else:
                    rows = con.execute(sql, [since_step]).fetchall()
            except duckdb.Error as e:       # a segment being replaced as it is read: next tick
                raise ProbeError(f"{d}: the store is being written ({str(e).splitlines()[0]})") from None
            finally:
                con.close()
            out += [{"job": j, "rank": r, "step": s, "name": n, "value": v} for j, r, s, n, v in rows]
        return out

    def health(self, job: str | None) -> dict[int, str]:
        """Each rank's health as the monitor sees it (ok, stale, lost, finished); none without
        a monitor."""
        if not self.monitor_addr or not job:
            return {}
        for j in self.client().status(job).get("jobs") or []:
            if j.get("job") == job:
                return {int(r["rank"]): r.get("health", "") for r in j.get("ranks", [])}
        return {}

    def alerts(self, job: str | None = None) -> list[dict[str, Any]]:
        """Alerts raised by the monitor's detectors for the followed job (or ``job``), oldest
        first; none without a monitor."""
        if not self.monitor_addr:
            return []
        job = job or self.current_job()
        return records(self.client().alerts(job=job)) if job else []

    def numerics_modules(self, job: str | None = None, newest: int | None = None) -> list[str]:
        """The modules that have per-module numerics points (``numerics:<module>:<quantity>``),
        in the order they were first sent; read from the last steps only (every watched module
        sends each step)."""
        if newest is None:                     # the job's last step: read two steps, never all
            newest = self._last_step(job)
            if newest is None:
                return []
        since = max(0, newest - 1)
        names = [p["name"] for p in self._numerics_points(job, since, names=None)]
        out: dict[str, None] = {}
        for name in names:
            parsed = parse_metric_name(name)
            if parsed is not None:
                out.setdefault(parsed[0])
        return list(out)

    def _last_step(self, job: str | None) -> int | None:
        """The last step the followed job (or ``job``) reported, None before its first."""
        if self.monitor_addr:
            job = job or self.current_job()
            jobs = self.client().status(job).get("jobs") or [] if job else []
            steps = [j.get("last_step") for j in jobs if j.get("job") == job]
            return steps[0] if steps and steps[0] is not None and steps[0] >= 0 else None
        sql, params = "select max(step) from metrics", []
        if self.job:
            sql, params = sql + " where job = ?", [self.job]
        steps = [rows[0][0] for rows in self._each_store(sql, params) if rows[0][0] is not None]
        return max(steps) if steps else None

    def _each_store(self, sql: str, params: list[Any]) -> Iterator[list[tuple]]:
        """The rows of ``sql`` in each readable store followed (a store being written says so
        in one line)."""
        import duckdb

        from probe.collectors.store import open_store

        for d in self.store_dirs:
            try:
                con = open_store(d)
            except ProbeError:
                continue
            try:
                rows = con.execute(sql, params).fetchall()
            except duckdb.Error as e:
                raise ProbeError(f"{d}: the store is being written ({str(e).splitlines()[0]})") from None
            finally:
                con.close()
            yield rows

    def numerics(self, module: str, quantity: str, since_step: int = 0,
                 job: str | None = None) -> list[dict[str, Any]]:
        """The points (rank, step, value) of one module's quantity from ``since_step`` on."""
        return self._numerics_points(job, since_step, names=[metric_name(module, quantity)])

    def _numerics_points(self, job: str | None, since_step: int,
                         names: list[str] | None) -> list[dict[str, Any]]:
        if self.monitor_addr:
            job = job or self.current_job()
            if not job:
                return []
            if names is None:
                rows = records(self.client().metrics(job=job, since_step=since_step))
                return [r for r in rows if str(r["name"]).startswith(NUMERICS_PREFIX)]
            return records(self.client().metrics(job=job, since_step=since_step, names=names))
        if names is None:
            where, params = "starts_with(name, ?)", [NUMERICS_PREFIX]
        else:
            where, params = "name = ?", [names[0]]
        sql = f"select job, rank, step, name, value from metrics where {where} and step >= ?"
        params.append(since_step)
        if self.job:
            sql, params = sql + " and job = ?", params + [self.job]
        return [{"job": j, "rank": r, "step": s, "name": n, "value": v}
                for rows in self._each_store(sql + " order by step, rank", params)
                for j, r, s, n, v in rows]

    def dumps(self, job: str | None = None) -> list[dict[str, Any]]:
        """The targeted dumps of the followed job (or ``job``), one row per (dump, rank), as
        the monitor lists them (:meth:`probe.monitor.client.MonitorClient.dumps`); none without a
        monitor."""
        if not self.monitor_addr:
            return []
        job = job or self.current_job()
        return records(self.client().dumps(job=job)) if job else []

    def status(self) -> dict[str, Any] | None:
        return self.client().status() if self.monitor_addr else None

    def request_trace(self, ranks: list[int], first: int, last: int) -> str:
        """Ask the monitor for a deep trace of steps ``first``..``last`` on ``ranks``."""
        if not self.monitor_addr:
            raise ProbeError("deep traces need the monitor service: start with probe web --monitor HOST:PORT")
        job = self.current_job()
        if not job:
            raise ProbeError(f"{self.monitor_addr}: the monitor knows no job yet")
        reply = self.client().request_trace(job, ranks, (first, last))
        missing = f", not connected: {reply['missing']}" if reply.get("missing") else ""
        return (f"trace {reply.get('trace_id', '')} requested: job {job}, ranks {reply.get('ranks', ranks)}, "
                f"steps {first}-{last}{missing}")
