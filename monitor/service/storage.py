"""The monitor's store: one DuckDB file, written and queried by the service process only.

DuckDB allows one writer per file, so the service owns the connection; the CLI and the web UI
read through the service (:mod:`probe.monitor.client`). Tables:

- ``metrics``    one row per metric point, the ``metric`` record schema of
                 :mod:`probe.collectors.records` (time_ns, job, rank, step, name, value);
- ``batches``    (job, rank, agent_id, seq, points, dropped, time_ns, last_step) of every
                 stored batch, in the same transaction as its points: the key for exactly-once
                 ingest, and the cheap source of per-rank status;
- ``ranks``      the last registration of each (job, rank);
- ``alerts``     detector findings with their evidence (JSON), one row per cause, updated in
                 place while it recurs (``count``, ``last_step``, ``state`` open or closed);
- ``trace_requests`` and ``traces``: deep traces asked for and the files collected;
- ``dump_requests`` and ``dumps``: targeted dumps asked for (scope, task, level, the alert that
  asked) and each rank's report (the folder it wrote on its machine, the steps, or an error).

Points arrive as Arrow tables and are inserted in groups (one transaction, one fsync, for many
batches: :meth:`MonitorStore.ingest`), never row by row.

>>> import tempfile, os, pyarrow as pa
>>> s = MonitorStore(os.path.join(tempfile.mkdtemp(), "m.duckdb"))
>>> t = pa.table({"time_ns": [1], "job": ["j"], "rank": pa.array([0], pa.int32()),
...               "step": [0], "name": ["loss"], "value": [2.5]})
>>> s.ingest([BatchKey("j", 0, "a1", 1, 0), ], [t])
[True]
>>> s.ingest([BatchKey("j", 0, "a1", 1, 0)], [t])     # resent after a lost ack
[False]
>>> s.metrics("j").num_rows
1
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from probe.collectors.records import METRIC
from probe.ground.errors import ProbeError
from probe.monitor.trace_transfer import safe_relpath

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS metrics (time_ns BIGINT, job VARCHAR, rank INTEGER, step BIGINT,
                                    name VARCHAR, value DOUBLE);
CREATE TABLE IF NOT EXISTS batches (job VARCHAR, rank INTEGER, agent_id VARCHAR, seq UBIGINT,
                                    points INTEGER, dropped UBIGINT, time_ns BIGINT,
                                    last_step BIGINT);
CREATE TABLE IF NOT EXISTS ranks (job VARCHAR, rank INTEGER, world_size INTEGER, host VARCHAR,
                                  pid BIGINT, engine VARCHAR, agent_id VARCHAR,
                                  registered_ns BIGINT, registrations INTEGER,
                                  finished_ns BIGINT, PRIMARY KEY (job, rank));
CREATE TABLE IF NOT EXISTS alerts (id BIGINT PRIMARY KEY, time_ns BIGINT, job VARCHAR,
                                   kind VARCHAR, rank INTEGER, step BIGINT, message VARCHAR,
                                   evidence VARCHAR);
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS count BIGINT DEFAULT 1;
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS last_step BIGINT;
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS state VARCHAR DEFAULT 'open';
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS updated_ns BIGINT;
CREATE TABLE IF NOT EXISTS trace_requests (trace_id VARCHAR PRIMARY KEY, job VARCHAR,
                                           ranks VARCHAR, start_step BIGINT, end_step BIGINT,
                                           next_steps BIGINT, reason VARCHAR, time_ns BIGINT);
CREATE TABLE IF NOT EXISTS traces (trace_id VARCHAR, job VARCHAR, rank INTEGER,
                                   start_step BIGINT, end_step BIGINT, filename VARCHAR,
                                   path VARCHAR, bytes BIGINT, error VARCHAR, time_ns BIGINT);
CREATE TABLE IF NOT EXISTS dump_requests (dump_id VARCHAR PRIMARY KEY, job VARCHAR,
                                          ranks VARCHAR, start_step BIGINT, end_step BIGINT,
                                          next_steps BIGINT, scope VARCHAR, task VARCHAR,
                                          level VARCHAR, reason VARCHAR, alert_id BIGINT,
                                          module VARCHAR, time_ns BIGINT);
CREATE TABLE IF NOT EXISTS dumps (dump_id VARCHAR, job VARCHAR, rank INTEGER, start_step BIGINT,
                                  end_step BIGINT, path VARCHAR, steps VARCHAR, files BIGINT,
                                  bytes BIGINT, error VARCHAR, time_ns BIGINT);
"""

#: Metric names the detectors read, pivoted per (rank, step) by :meth:`MonitorStore.step_table`.
STEP_COLUMNS = ("step_time_ms", "compute_time_ms", "compute_cpu_ms", "comm_time_ms",
                "data_time_ms", "loss", "grad_norm", "nonfinite_grads", "tokens_per_s", "traced",
                "device_mem_mb", "proc_rss_mb")
ALERT_COLUMNS = ("id", "time_ns", "job", "kind", "rank", "step", "message", "evidence", "count",
                 "last_step", "state", "updated_ns")


@dataclass(frozen=True)
class BatchKey:
    """Who sent a batch and its sequence number: the identity that makes ingest exactly-once."""

    job: str
    rank: int
    agent_id: str
    seq: int
    dropped: int = 0
    last_step: int = -1


def _json_default(value: Any) -> Any:
    """numpy numbers and arrays in alert evidence, as JSON has them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return float(value)


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


#: An open alert's updates (its count, last step, message and evidence, once per step it is
#: seen again) are written at most this often (seconds), and whenever the alerts are read: an
#: UPDATE costs ~1.5 ms of DuckDB work in a store of a million points, a tenth of the
#: detectors' whole work per step at 1,024 ranks. A crash loses at most this much of them.
ALERT_WRITE_S = 1.0


class MonitorStore:
    """The DuckDB store of one monitor service; thread-safe (one write lock; reads on a
    cursor of the reading thread's own, kept for its next read)."""

    def __init__(self, path: str | os.PathLike) -> None:
        import duckdb

        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._con = duckdb.connect(str(self.path))
        except (OSError, duckdb.Error) as e:
            msg = str(e).splitlines()[0]
            raise ProbeError(f"{self.path}: cannot open the monitor store ({msg}); "
                             "is another 'probe monitor serve' using it?") from None
        self.trace_dir = self.path.with_name(self.path.stem + "-traces")
        self._lock = threading.Lock()
        self._local = threading.local()                   # each reading thread's cursor
        # every one, closed with the store (a thread that ends lets its cursor go with it)
        self._cursors: weakref.WeakSet[Any] = weakref.WeakSet()
        self._alert_updates: dict[int, list[Any]] = {}    # alert id -> its pending UPDATE's values
        self._alert_updates_since: float | None = None
        self._con.execute(SCHEMA_SQL)
        # An agent sends its batches in sequence order, one at a time, and resends from the
        # oldest unacknowledged one: so the highest stored seq per agent says what is stored.
        self._high: dict[str, int] = dict(self._con.execute(
            "SELECT agent_id, max(seq) FROM batches GROUP BY agent_id").fetchall())
        self._next_alert_id = 1 + (self._con.execute("SELECT coalesce(max(id), 0) FROM alerts")
                                   .fetchone()[0])
        #: The jobs that sent ``numerics:*`` points (the detector thread queries only theirs).
        self.numerics_jobs: set[str] = {row[0] for row in self._con.execute(
            "SELECT DISTINCT job FROM metrics WHERE starts_with(name, 'numerics:')").fetchall()}

    # -- writing -------------------------------------------------------------------------------

    def ingest(self, keys: Sequence[BatchKey], tables: Sequence[pa.Table]) -> list[bool]:
        """Store many batches in one transaction; returns, per batch, False if it was a duplicate.

        Each table has the ``metric`` schema. Sequence numbers rise per agent; a batch whose seq
        is not above the agent's highest stored one (or its group's) is a resend and skipped, so
        resending after a lost ack is harmless.
        """
        fresh: list[bool] = []
        rows: list[tuple] = []
        parts: list[pa.Table] = []
        numerics: set[str] = set()
        now = time.time_ns()
        with self._lock:
            high = dict(self._high)
            for key, table in zip(keys, tables):
                if key.seq <= high.get(key.agent_id, 0):
                    fresh.append(False)
                    continue
                high[key.agent_id] = key.seq
                fresh.append(True)
                rows.append((key.job, key.rank, key.agent_id, key.seq, table.num_rows,
                             key.dropped, now, key.last_step))
                if table.num_rows:
                    parts.append(table)
                    if key.job not in self.numerics_jobs and _has_numerics(table.column("name")):
                        numerics.add(key.job)
            if not rows:
                return fresh
            points = pa.concat_tables(parts) if parts else METRIC.empty_table()
            con = self._con
            con.execute("BEGIN TRANSACTION")
            try:
                con.register("_incoming", points)
                con.execute("INSERT INTO metrics SELECT time_ns, job, rank, step, name, value "
                            "FROM _incoming")
                con.unregister("_incoming")
                con.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            self._high = high
            self.numerics_jobs |= numerics
        return fresh

    def register_rank(self, job: str, rank: int, world_size: int, host: str, pid: int,
                      engine: str, agent_id: str) -> bool:
        """Record a rank's registration; returns True when it replaces an earlier agent."""
        with self._lock:
            old = self._con.execute("SELECT agent_id, registrations FROM ranks WHERE job = ? AND "
                                    "rank = ?", [job, rank]).fetchone()
            count = 1 + (old[1] if old else 0)
            self._con.execute("INSERT OR REPLACE INTO ranks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              [job, rank, world_size, host, pid, engine, agent_id,
                               time.time_ns(), count, None])
        return bool(old) and old[0] != agent_id

    def mark_finished(self, job: str, rank: int) -> None:
        """Record that a rank has sent its last batch (its training ended)."""
        with self._lock:
            self._con.execute("UPDATE ranks SET finished_ns = ? WHERE job = ? AND rank = ?",
                              [time.time_ns(), job, rank])

    def add_alert(self, alert: dict[str, Any]) -> dict[str, Any]:
        """Store a new alert (kind, job, rank, step, message, evidence; count, last_step and
        state when given); returns it with its id and time."""
        with self._lock:
            alert = dict(alert, id=self._next_alert_id, time_ns=alert.get("time_ns") or time.time_ns())
            self._next_alert_id += 1
            self._con.execute(f"INSERT INTO alerts ({', '.join(ALERT_COLUMNS)}) VALUES "
                              f"({', '.join('?' * len(ALERT_COLUMNS))})",
                              [alert["id"], alert["time_ns"], alert["job"], alert["kind"],
                               alert.get("rank"), alert.get("step"), alert.get("message", ""),
                               json.dumps(alert.get("evidence", {}), default=_json_default),
                               alert.get("count", 1), alert.get("last_step", alert.get("step")),
                               alert.get("state", "open"), alert["time_ns"]])
        return alert

    def update_alert(self, alert: dict[str, Any]) -> None:
        """Store an open alert again (by id): its message, evidence, count, last step, state.

        Written behind: at once when its state changes (resolved, closed), else with the
        others pending when the oldest has waited :data:`ALERT_WRITE_S`, when any alert is
        read (:meth:`alerts`, :meth:`open_alerts`, :meth:`rows`) and at :meth:`close`; so every
        reader sees the latest."""
        values = [alert.get("message", ""),
                  json.dumps(alert.get("evidence", {}), default=_json_default),
                  alert.get("count", 1), alert.get("last_step"), alert.get("state", "open"),
                  time.time_ns(), alert["id"]]
        now = time.monotonic()
        with self._lock:
            self._alert_updates[alert["id"]] = values
            if self._alert_updates_since is None:
                self._alert_updates_since = now
            if values[4] != "open" or now - self._alert_updates_since >= ALERT_WRITE_S:
                self._write_alert_updates()

    def _write_alert_updates(self) -> None:
        """The pending alert updates, in one transaction (the caller holds the lock)."""
        pending, self._alert_updates = self._alert_updates, {}
        self._alert_updates_since = None
        if not pending:
            return
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.executemany("UPDATE alerts SET message = ?, evidence = ?, count = ?, "
                                  "last_step = ?, state = ?, updated_ns = ? WHERE id = ?",
                                  list(pending.values()))
            self._con.execute("COMMIT")
        except BaseException:
            self._con.execute("ROLLBACK")
            raise

    def _alerts_current(self) -> None:
        """Write the pending alert updates before a read that may see the alerts."""
        if self._alert_updates:
            with self._lock:
                self._write_alert_updates()

    def open_alerts(self) -> list[dict[str, Any]]:
        """Alerts still open (to go on updating them after a restart), evidence decoded."""
        out = []
        for a in self._query("SELECT * FROM alerts WHERE coalesce(state, 'open') = 'open' "
                             "ORDER BY id").to_pylist():
            a["evidence"] = json.loads(a["evidence"] or "{}")
            out.append(a)
        return out

    def add_trace_request(self, trace_id: str, job: str, ranks: Iterable[int], start_step: int,
                          end_step: int, next_steps: int, reason: str) -> None:
        with self._lock:
            self._con.execute("INSERT INTO trace_requests VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                              [trace_id, job, json.dumps(sorted(ranks)), start_step, end_step,
                               next_steps, reason, time.time_ns()])

    def add_trace_files(self, trace_id: str, job: str, rank: int, start_step: int, end_step: int,
                        files: Sequence[tuple[str, str | None, int, str]]) -> None:
        """Record one rank's whole upload of a trace, ``files`` = (filename, path, bytes, error),
        at once: a reader sees all of its files or none, and a resent upload replaces the last."""
        now = time.time_ns()
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.execute("DELETE FROM traces WHERE trace_id = ? AND job = ? AND rank = ?",
                                  [trace_id, job, rank])
                for filename, path, nbytes, error in files:
                    self._con.execute("INSERT INTO traces VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                      [trace_id, job, rank, start_step, end_step, filename, path,
                                       nbytes, error or None, now])
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise

    def add_dump_request(self, dump_id: str, job: str, ranks: Iterable[int], start_step: int,
                         end_step: int, next_steps: int, scope: str, task: str, level: str,
                         reason: str, alert_id: int | None = None, module: str = "") -> None:
        """Record a targeted dump asked for (by an operator, or by the alert ``alert_id``)."""
        with self._lock:
            self._con.execute("INSERT INTO dump_requests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                              "?, ?)", [dump_id, job, json.dumps(sorted(ranks)), start_step,
                                        end_step, next_steps, scope, task, level, reason,
                                        alert_id or None, module or None, time.time_ns()])

    def add_dump_report(self, dump_id: str, job: str, rank: int, start_step: int, end_step: int,
                        path: str, steps: Sequence[int], files: int, nbytes: int,
                        error: str) -> None:
        """Record one rank's report of a targeted dump (a resent report replaces the last)."""
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.execute("DELETE FROM dumps WHERE dump_id = ? AND job = ? AND rank = ?",
                                  [dump_id, job, rank])
                self._con.execute("INSERT INTO dumps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                  [dump_id, job, rank, start_step, end_step, path or None,
                                   json.dumps(list(steps)), files, nbytes, error or None,
                                   time.time_ns()])
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise

    def dumps(self, job: str | None = None, dump_id: str | None = None) -> pa.Table:
        """Targeted dumps, one row per (dump, rank) asked for: the request (scope, task, level,
        reason, alert_id, module) and, once the rank has reported, its folder, steps (JSON),
        files, bytes and error; ``state`` is ``pending``, ``done`` or ``failed``."""
        where, params = _equal_to(["true"], [], **{"q.job": job, "q.dump_id": dump_id})
        return self._query(f"""
            WITH q AS (SELECT r.*, CAST(unnest(CAST(json(r.ranks) AS INTEGER[])) AS INTEGER) AS rank
                       FROM dump_requests r)
            SELECT q.dump_id, q.job, q.rank, coalesce(d.start_step, q.start_step) AS start_step,
                   coalesce(d.end_step, q.end_step) AS end_step, q.next_steps, q.scope, q.task,
                   q.level, q.reason, q.alert_id, q.module, d.path, d.steps, d.files, d.bytes,
                   d.error, CASE WHEN d.dump_id IS NULL THEN 'pending' WHEN d.error IS NULL
                   THEN 'done' ELSE 'failed' END AS state, q.time_ns AS requested_ns,
                   d.time_ns AS reported_ns
            FROM q LEFT JOIN dumps d ON d.dump_id = q.dump_id AND d.job = q.job AND d.rank = q.rank
            WHERE {where} ORDER BY q.time_ns, q.dump_id, q.rank""", params)

    def trace_file_path(self, job: str, trace_id: str, rank: int, filename: str) -> Path:
        """Where a collected trace file lives: ``<store>-traces/<job>/<trace_id>/rank<R>/<file>``."""
        return (self.trace_dir / safe_relpath(job) / safe_relpath(trace_id) / f"rank{int(rank)}"
                / safe_relpath(filename))

    def close(self) -> None:
        with self._lock:
            self._write_alert_updates()
            for cur in list(self._cursors):
                cur.close()
            self._cursors.clear()
            self._con.close()

    # -- reading -------------------------------------------------------------------------------

    def _cursor(self) -> Any:
        """This thread's read cursor (a new one's first query costs DuckDB ~0.5 ms more: at every
        step, the detector thread's query of the new points paid it)."""
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self._con.cursor()
            with self._lock:
                self._cursors.add(cur)
        return cur

    def _query(self, sql: str, params: Sequence[Any] = (), *, alerts: bool = True) -> pa.Table:
        """``sql``'s result; ``alerts=False``: a read that never sees the alerts table (the
        detectors' per-step reads), which the pending alert updates need not wait for."""
        if alerts:
            self._alerts_current()
        return self._cursor().sql(sql, params=list(params) or None).to_arrow_table()

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        self._alerts_current()
        return self._cursor().execute(sql, list(params)).fetchall()

    def metrics(self, job: str | None = None, since_step: int = 0, ranks: Sequence[int] = (),
                names: Sequence[str] = (), pivot: bool = False, limit: int = 0,
                until_step: int | None = None) -> pa.Table:
        """Metric points (long: time_ns, job, rank, step, name, value) or pivoted per rank/step."""
        where, params = ["step >= ?"], [since_step]
        if until_step is not None:
            where.append("step <= ?")
            params.append(until_step)
        if job:
            where.append("job = ?")
            params.append(job)
        if ranks:
            where.append(f"rank IN ({', '.join(str(int(r)) for r in ranks)})")
        if names:
            where.append(f"name IN ({', '.join(_sql_str(n) for n in names)})")
        cond = " AND ".join(where)
        lim = f" LIMIT {int(limit)}" if limit > 0 else ""
        if not pivot:
            return self._query(f"SELECT * FROM metrics WHERE {cond} ORDER BY job, step, rank, name"
                               f"{lim}", params)
        cols = list(names) or [r[0] for r in self.rows(
            f"SELECT DISTINCT name FROM metrics WHERE {cond} ORDER BY name", params)]
        select = ", ".join(f"max(CASE WHEN name = {_sql_str(c)} THEN value END) AS "
                           f"\"{c.replace(chr(34), '')}\"" for c in cols)
        select = (", " + select) if select else ""
        return self._query(f"SELECT job, rank, step, min(time_ns) AS time_ns{select} FROM metrics "
                           f"WHERE {cond} GROUP BY job, rank, step ORDER BY job, step, rank{lim}",
                           params)

    def step_points(self, job: str, since_step: int, until_step: int) -> pa.Table:
        """The detectors' input, long: (rank, step, name, value) of :data:`STEP_COLUMNS` for
        the steps ``since_step..until_step`` (no pivot: the detectors lay it out themselves)."""
        names = ", ".join(_sql_str(n) for n in STEP_COLUMNS)
        return self._query(f"SELECT rank, step, name, value FROM metrics WHERE job = ? AND "
                           f"step >= ? AND step <= ? AND name IN ({names})",
                           [job, since_step, until_step], alerts=False)

    def numerics_points(self, job: str, since_step: int, until_step: int) -> pa.Table:
        """The numerics detectors' input, long: (rank, step, name, value, time_ns) of the
        ``numerics:*`` points (:mod:`probe.monitor.numerics_names`) of the steps
        ``since_step..until_step``."""
        return self._query("SELECT rank, step, name, value, time_ns FROM metrics WHERE job = ? "
                           "AND step >= ? AND step <= ? AND starts_with(name, 'numerics:')",
                           [job, since_step, until_step], alerts=False)

    def step_table(self, job: str, since_step: int, until_step: int | None = None) -> pa.Table:
        """The detectors' input: one row per (rank, step) with :data:`STEP_COLUMNS`, for the
        steps from ``since_step`` (to ``until_step``, inclusive, when given)."""
        return self.metrics(job, since_step=since_step, names=STEP_COLUMNS, pivot=True,
                            until_step=until_step)

    def alerts(self, job: str | None = None, since_id: int = 0, kind: str | None = None) -> pa.Table:
        where, params = _equal_to(["id > ?"], [since_id], job=job, kind=kind)
        return self._query(f"SELECT * FROM alerts WHERE {where} ORDER BY id", params)

    def traces(self, job: str | None = None, trace_id: str | None = None) -> pa.Table:
        where, params = _equal_to(["true"], [], **{"t.job": job, "t.trace_id": trace_id})
        return self._query(f"SELECT t.* FROM traces t WHERE {where} "
                           "ORDER BY t.trace_id, t.rank, t.filename", params)

    def trace_requests(self, job: str | None = None) -> pa.Table:
        if job:
            return self._query("SELECT * FROM trace_requests WHERE job = ? ORDER BY time_ns", [job])
        return self._query("SELECT * FROM trace_requests ORDER BY time_ns")

    def job_summary(self) -> list[dict[str, Any]]:
        """Per (job, rank): registration, last step, points and batches stored.

        Read from the small ``batches`` table (one row per batch), never a scan of ``metrics``.
        """
        rows = self.rows("""
            WITH b AS (SELECT job, rank, max(last_step) AS last_step, sum(points) AS points,
                              max(time_ns) AS last_time_ns, count(*) AS batches,
                              sum(dropped) AS dropped
                       FROM batches GROUP BY job, rank)
            SELECT coalesce(r.job, b.job), coalesce(r.rank, b.rank), r.world_size, r.host, r.pid,
                   r.engine, r.agent_id, r.registrations, b.last_step, coalesce(b.points, 0),
                   b.last_time_ns, coalesce(b.batches, 0), coalesce(b.dropped, 0), r.finished_ns
            FROM ranks r FULL OUTER JOIN b ON r.job = b.job AND r.rank = b.rank
            ORDER BY 1, 2""")
        keys = ("job", "rank", "world_size", "host", "pid", "engine", "agent_id", "registrations",
                "last_step", "points", "last_time_ns", "batches", "dropped", "finished_ns")
        return [dict(zip(keys, r)) for r in rows]


def _equal_to(where: list[str], params: list[Any], **columns: Any) -> tuple[str, list[Any]]:
    """``where`` and'ed with ``column = ?`` for each column given a value (None/empty: any)."""
    for column, value in columns.items():
        if value:
            where.append(f"{column} = ?")
            params.append(value)
    return " AND ".join(where), params


def _has_numerics(names: pa.ChunkedArray) -> bool:
    """Whether a batch's metric names (plain or dictionary-encoded) hold a ``numerics:*`` one."""
    for chunk in names.chunks:
        values = chunk.dictionary if pa.types.is_dictionary(chunk.type) else chunk
        if len(values) and pc.any(pc.starts_with(values, "numerics:")).as_py():
            return True
    return False
