"""The monitor service: one gRPC server that ingests metric batches, detects, and commands ranks.

Ranks (:mod:`monitor.agent`) register, push columnar metric batches and hold a command
stream open; operators (:mod:`monitor.client`, ``probe monitor``, the web UI) query status,
alerts, metrics and traces, request deep traces, and watch alerts live. One process owns the
DuckDB store (:mod:`monitor.storage`), writes it and answers queries from it.

Inside, the hot path is:

- ``Push`` checks and decodes a batch into an Arrow table (no per-point Python), hands it to
  the writer thread and waits for the ack;
- the writer thread takes every batch waiting, inserts them in one transaction with their
  (agent_id, seq) keys (group commit: one fsync for many ranks) and wakes their callers: an ack
  means durable, and a batch resent after a lost ack is acknowledged without being stored again;
- the detector thread evaluates each job's newly complete steps (every live rank reported)
  with :func:`monitor.detectors.detect`, stores alerts and pushes them to watchers; a configured
  alert kind can trigger a deep trace on the rank it names.

>>> svc = MonitorService(store_path="/tmp/doc-monitor.duckdb", port=0)   # doctest: +SKIP
>>> port = svc.start(); svc.wait()                                          # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
import uuid
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import numpy as np
import pyarrow as pa

from monitor import auth, detectors
from monitor.proto import monitor_pb2 as pb
from monitor.proto import monitor_pb2_grpc as pb_grpc
from monitor.storage import BatchKey, MonitorStore
from ground.errors import ProbeError

#: The most points one batch may carry; larger batches are refused (agents split theirs).
MAX_BATCH_POINTS = 65_536
#: The largest message the service accepts (bytes).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: The largest query answer sent in one reply (bytes).
MAX_REPLY_BYTES = 60 * 1024 * 1024
#: The largest trace file a rank may upload (bytes).
MAX_TRACE_BYTES = 1 << 31
MAX_NAME_LEN = 256
#: Group commit: the most points inserted in one transaction.
MAX_GROUP_POINTS = 1_000_000
#: Seconds without a batch or heartbeat after which a rank is "stale", then "lost".
STALE_AFTER_S = 5.0
LOST_AFTER_S = 15.0
#: Steps of history the detectors look back over.
DETECT_HISTORY = 25
#: An alert of the same kind for the same rank is not repeated within this many steps.
ALERT_COOLDOWN_STEPS = {"straggler": 50, "nonfinite": 20, "slow_step": 0}


@dataclass
class RankState:
    """What the service knows of a rank while it runs (not persisted; the store has the rest)."""

    job: str
    rank: int
    world_size: int = 0
    host: str = ""
    pid: int = 0
    engine: str = ""
    agent_id: str = ""
    last_seen: float = 0.0
    last_step: int = -1
    final: bool = False
    connected: bool = False
    commands: "queue.Queue[pb.Command]" = field(default_factory=queue.Queue)
    lost_alerted: bool = False


@dataclass
class _Pending:
    key: BatchKey
    table: pa.Table
    done: threading.Event = field(default_factory=threading.Event)
    fresh: bool = False
    error: str = ""


def _check_name(value: str, what: str, context: grpc.ServicerContext) -> None:
    if not value or len(value) > MAX_NAME_LEN:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what} must be 1 to {MAX_NAME_LEN} characters (got {len(value)})")


def decode_batch(batch: pb.MetricBatch) -> pa.Table:
    """The batch's points as a ``metric`` table; ValueError says what is malformed.

    >>> b = pb.MetricBatch(job="j", rank=1, agent_id="a", seq=1, names=["loss"],
    ...                    name_index=np.int32([0]).tobytes(), steps=np.int64([7]).tobytes(),
    ...                    time_ns=np.int64([5]).tobytes(), values=np.float64([2.5]).tobytes())
    >>> decode_batch(b).to_pylist()
    [{'time_ns': 5, 'job': 'j', 'rank': 1, 'step': 7, 'name': 'loss', 'value': 2.5}]
    """
    if len(batch.values) % 8:
        raise ValueError("values is not a whole number of float64")
    n = len(batch.values) // 8
    if n > MAX_BATCH_POINTS:
        raise ValueError(f"{n} points in one batch; the limit is {MAX_BATCH_POINTS}")
    if len(batch.name_index) != 4 * n or len(batch.steps) != 8 * n or len(batch.time_ns) != 8 * n:
        raise ValueError(f"columns disagree: {n} values but name_index/steps/time_ns have "
                         f"{len(batch.name_index)}/{len(batch.steps)}/{len(batch.time_ns)} bytes")
    names = list(batch.names)
    if any(not s or len(s) > MAX_NAME_LEN for s in names):
        raise ValueError(f"metric names must be 1 to {MAX_NAME_LEN} characters")
    idx = np.frombuffer(batch.name_index, dtype="<i4")
    if n and (int(idx.min()) < 0 or int(idx.max()) >= len(names)):
        raise ValueError(f"name_index points outside the {len(names)} names")
    steps = np.frombuffer(batch.steps, dtype="<i8")
    if n and int(steps.min()) < 0:
        raise ValueError("negative step")
    return pa.table({
        "time_ns": pa.array(np.frombuffer(batch.time_ns, dtype="<i8")),
        "job": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                              pa.array([batch.job], pa.string())),
        "rank": pa.array(np.full(n, batch.rank, dtype=np.int32)),
        "step": pa.array(steps),
        "name": pa.DictionaryArray.from_arrays(pa.array(idx), pa.array(names, pa.string())),
        "value": pa.array(np.frombuffer(batch.values, dtype="<f8")),
    })


def _ipc(table: pa.Table, context: grpc.ServicerContext) -> pb.ArrowTable:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    data = sink.getvalue()
    if data.size > MAX_REPLY_BYTES:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"the answer has {table.num_rows} rows ({data.size / 2**20:.0f} MiB), over the "
                      f"{MAX_REPLY_BYTES >> 20} MiB limit of one reply; narrow it with since_step, "
                      "ranks, names or limit")
    return pb.ArrowTable(ipc=data.to_pybytes())


class MonitorService(pb_grpc.MonitorServicer):
    """The gRPC monitor: see the module docstring. ``start()`` binds; ``stop()`` shuts down.

    Each connected rank holds one server thread for its command stream; threads are made on
    demand up to ``max_workers``, so the default serves a couple of thousand ranks.
    """

    def __init__(self, store_path: str | os.PathLike = "monitor.duckdb", host: str = "127.0.0.1",
                 port: int = 50051, token: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, trace_on_alert: dict[str, int] | None = None,
                 detect_interval_s: float = 0.25, max_workers: int = 4096,
                 lost_after_s: float = LOST_AFTER_S,
                 log: Callable[[str], None] | None = None) -> None:
        auth.check_bind(host, token)
        self.host, self.port, self.token = host, port, token
        self._creds = auth.server_credentials(tls_cert, tls_key)
        self.store = MonitorStore(store_path)
        self.trace_on_alert = dict(trace_on_alert or {})
        self.detect_interval_s = detect_interval_s
        self.max_workers = max_workers
        self.lost_after_s = lost_after_s
        self._log = log or (lambda line: None)
        self._ranks: dict[tuple[str, int], RankState] = {}
        self._ranks_lock = threading.Lock()
        self._undelivered: dict[tuple[str, int], list[pb.Command]] = {}
        self._writes: "queue.Queue[_Pending | None]" = queue.Queue()
        self._watchers: list[queue.Queue] = []
        self._watch_lock = threading.Lock()
        self._dirty: set[str] = set()
        self._evaluated: dict[str, int] = {}
        self._last_alert_step: dict[tuple[str, str, int], int] = {}
        self._triggered: set[tuple[str, int, str]] = set()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: grpc.Server | None = None
        self.started = time.time()
        self.points_ingested = 0
        # After a restart, detect on new steps only, and do not repeat alerts already raised.
        for job, step in self.store.rows("SELECT job, max(step) FROM metrics GROUP BY job"):
            self._evaluated[job] = -1 if step is None else int(step)
        for job, kind, rank, step in self.store.rows(
                "SELECT job, kind, rank, max(step) FROM alerts GROUP BY job, kind, rank"):
            self._last_alert_step[(job, kind, rank)] = -1 if step is None else int(step)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> int:
        """Bind and start serving; returns the port (useful with ``port=0``)."""
        interceptors = [auth.TokenInterceptor(self.token)] if self.token else []
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="monitor"),
            interceptors=interceptors, maximum_concurrent_rpcs=None,
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", 64 * 1024 * 1024),
                     ("grpc.so_reuseport", 0)])
        pb_grpc.add_MonitorServicer_to_server(self, server)
        addr = f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"
        try:
            port = (server.add_secure_port(addr, self._creds) if self._creds
                    else server.add_insecure_port(addr))
        except RuntimeError as e:
            raise ProbeError(f"{addr}: cannot listen ({e}); is the port in use? pick another "
                             "with --port") from None
        if not port:
            raise ProbeError(f"{addr}: cannot listen; is the port in use? pick another with --port")
        self.port = port
        for target, name in ((self._writer_loop, "monitor-writer"),
                             (self._detector_loop, "monitor-detect")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        server.start()
        self._server = server
        return port

    def wait(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving, finish the writes in flight, close the store."""
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace).wait()
        self._writes.put(None)
        for t in self._threads:
            t.join(timeout=10)
        self.store.close()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- rank side -----------------------------------------------------------------------------

    def _state(self, job: str, rank: int) -> RankState:
        key = (job, rank)
        with self._ranks_lock:
            st = self._ranks.get(key)
            if st is None:
                st = self._ranks[key] = RankState(job=job, rank=rank)
            return st

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        _check_name(request.job, "job", context)
        _check_name(request.agent_id, "agent_id", context)
        if request.rank < 0 or request.world_size < 0 or (request.world_size and
                                                           request.rank >= request.world_size):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"rank {request.rank} does not fit world size {request.world_size}")
        replaced = self.store.register_rank(request.job, request.rank, request.world_size,
                                            request.host[:MAX_NAME_LEN], request.pid,
                                            request.engine[:MAX_NAME_LEN], request.agent_id)
        st = self._state(request.job, request.rank)
        with self._ranks_lock:
            if st.agent_id and st.agent_id != request.agent_id:
                replaced = True
                st.connected = False
                st.commands.put(None)           # ends the old agent's command stream
                st.commands = queue.Queue()
            st.world_size, st.host, st.pid = request.world_size, request.host, request.pid
            st.engine, st.agent_id = request.engine, request.agent_id
            st.last_seen, st.final, st.lost_alerted = time.time(), False, False
        msg = "registered again; the earlier agent of this rank is replaced" if replaced else "registered"
        self._log(f"job {request.job} rank {request.rank}/{request.world_size} {msg} "
                  f"({request.host}:{request.pid}, {request.engine or 'engine?'})")
        return pb.RegisterReply(accepted=True, message=msg, max_batch_points=MAX_BATCH_POINTS,
                                replaced=replaced)

    def Push(self, request: pb.MetricBatch, context: grpc.ServicerContext) -> pb.PushAck:
        _check_name(request.job, "job", context)
        _check_name(request.agent_id, "agent_id", context)
        if request.rank < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rank {request.rank} is negative")
        st = self._state(request.job, request.rank)
        if request.seq == 0:
            if request.values:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "seq 0 is a heartbeat: no points")
            self._seen(st, request, -1)
            return pb.PushAck(seq=0)
        try:
            table = decode_batch(request)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed metric batch: {e}")
        last = int(table.column("step").to_numpy().max()) if table.num_rows else -1
        item = _Pending(BatchKey(request.job, request.rank, request.agent_id, request.seq,
                                 request.dropped, last), table)
        self._writes.put(item)
        if not item.done.wait(timeout=60.0) or item.error:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"the store could not take the batch ({item.error or 'timed out'}); "
                          "resend it")
        self._seen(st, request, last)
        if item.fresh:
            self._dirty.add(request.job)
        return pb.PushAck(seq=request.seq, duplicate=not item.fresh,
                          stored=table.num_rows if item.fresh else 0)

    def _seen(self, st: RankState, request: pb.MetricBatch, last_step: int) -> None:
        st.last_seen = time.time()
        st.last_step = max(st.last_step, last_step)
        st.lost_alerted = False
        if request.final and not st.final:
            st.final = True
            self.store.mark_finished(st.job, st.rank)
            self._dirty.add(st.job)

    def Commands(self, request: pb.CommandStreamRequest,
                 context: grpc.ServicerContext) -> Iterator[pb.Command]:
        _check_name(request.job, "job", context)
        st = self._state(request.job, request.rank)
        with self._ranks_lock:
            if st.agent_id and request.agent_id != st.agent_id:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "this agent is not the registered one for the rank; register first")
            commands = st.commands
            st.connected = True
            waiting = self._undelivered.pop((request.job, request.rank), [])
        for cmd in waiting:
            commands.put(cmd)
        try:
            while context.is_active() and not self._stopping.is_set():
                try:
                    cmd = commands.get(timeout=0.5)
                except queue.Empty:
                    continue
                if cmd is None:
                    return
                yield cmd
        finally:
            with self._ranks_lock:
                if st.commands is commands:
                    st.connected = False

    def UploadTrace(self, request_iterator: Iterator[pb.TraceChunk],
                    context: grpc.ServicerContext) -> pb.TraceAck:
        total, current, handle, path = 0, None, None, None
        # the upload's files are recorded together once the stream has ended, so a reader (and
        # wait_trace) never sees a rank's trace with some of its files missing
        uploads: dict[tuple, list[tuple[str, str | None, int, str]]] = {}
        events: list[dict[str, Any]] = []
        try:
            for chunk in request_iterator:
                upload = (chunk.trace_id, chunk.job, chunk.rank, chunk.start_step, chunk.end_step)
                if chunk.error:
                    self._log(f"trace {chunk.trace_id} job {chunk.job} rank {chunk.rank}: no trace: "
                              f"{chunk.error[:200]}")
                    uploads.setdefault(upload, []).append(("", None, 0, chunk.error[:2000]))
                    events.append({"type": "trace", "trace_id": chunk.trace_id, "job": chunk.job,
                                   "rank": chunk.rank, "error": chunk.error[:2000]})
                    continue
                key = (chunk.trace_id, chunk.job, chunk.rank, chunk.filename)
                if current != key:
                    if handle is not None:
                        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                      f"file {current[3]} was not finished before {chunk.filename}")
                    _check_name(chunk.trace_id, "trace_id", context)
                    _check_name(chunk.job, "job", context)
                    _check_name(chunk.filename, "filename", context)
                    current = key
                    path = self.store.trace_file_path(chunk.job, chunk.trace_id, chunk.rank,
                                                      chunk.filename)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    handle = open(path, "wb")
                    size = 0
                handle.write(chunk.data)
                size += len(chunk.data)
                total += len(chunk.data)
                if size > MAX_TRACE_BYTES:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"trace file {chunk.filename} is over {MAX_TRACE_BYTES} bytes")
                if chunk.last:
                    handle.close()
                    handle = None
                    uploads.setdefault(upload, []).append((chunk.filename, str(path), size, ""))
                    self._log(f"trace {chunk.trace_id} job {chunk.job} rank {chunk.rank} steps "
                              f"{chunk.start_step}-{chunk.end_step}: {chunk.filename} ({size} bytes)")
                    events.append({"type": "trace", "trace_id": chunk.trace_id, "job": chunk.job,
                                   "rank": chunk.rank, "file": chunk.filename, "path": str(path),
                                   "bytes": size, "start_step": chunk.start_step,
                                   "end_step": chunk.end_step})
                    current = None
            if handle is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"the upload ended inside file {current[3]}")
            for upload, files in uploads.items():
                self.store.add_trace_files(*upload, files)
            uploads.clear()
            for event in events:
                self._broadcast(event)
        finally:
            if handle is not None:
                handle.close()
                if path is not None:
                    path.unlink(missing_ok=True)
            for files in uploads.values():        # refused: nothing of it stays on disk either
                for _, done, _, _ in files:
                    if done:
                        Path(done).unlink(missing_ok=True)
        return pb.TraceAck(ok=True, bytes=total, message="stored")

    # -- operator side -------------------------------------------------------------------------

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.JsonDoc:
        return pb.JsonDoc(json=json.dumps(self.status(request.job or None), default=str))

    def status(self, job: str | None = None) -> dict[str, Any]:
        """The status document: service, ``jobs[].ranks[]`` with health, recent ``alerts[]``."""
        now = time.time()
        jobs: dict[str, dict[str, Any]] = {}
        for row in self.store.job_summary():
            if job and row["job"] != job:
                continue
            st = self._ranks.get((row["job"], row["rank"]))
            last_seen = max(st.last_seen if st else 0.0, (row["last_time_ns"] or 0) / 1e9)
            age = now - last_seen if last_seen else None
            if (st.final if st is not None and st.agent_id else row["finished_ns"] is not None):
                health = "finished"
            elif age is None or age > self.lost_after_s:
                health = "lost"
            elif age > min(STALE_AFTER_S, self.lost_after_s / 2):
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
            })
        alerts = []
        for a in self.store.alerts(job).to_pylist()[-200:]:
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
            j["health"] = ("finished" if healths == {"finished"} else
                           "degraded" if healths & {"lost", "stale"} else "ok")
            j["alerts"] = by_job.get(j["job"], {})
            j["judged_step"] = self._evaluated.get(j["job"], -1)   # detectors have seen steps <= this
        traces = self.store.traces(job).to_pylist()
        return {"service": {"address": self.address, "store": str(self.store.path),
                            "uptime_s": round(now - self.started, 3),
                            "points_ingested": self.points_ingested, "auth": bool(self.token),
                            "tls": self._creds is not None},
                "jobs": sorted(jobs.values(), key=lambda j: j["job"]),
                "alerts": alerts, "traces": traces}

    def Alerts(self, request: pb.AlertsRequest, context: grpc.ServicerContext) -> pb.ArrowTable:
        return _ipc(self.store.alerts(request.job or None, request.since_id, request.kind or None),
                    context)

    def Metrics(self, request: pb.MetricsRequest, context: grpc.ServicerContext) -> pb.ArrowTable:
        return _ipc(self.store.metrics(request.job or None, request.since_step, list(request.ranks),
                                       list(request.names), request.pivot, request.limit), context)

    def Traces(self, request: pb.TracesRequest, context: grpc.ServicerContext) -> pb.ArrowTable:
        return _ipc(self.store.traces(request.job or None, request.trace_id or None), context)

    def RequestTrace(self, request: pb.TraceRequest, context: grpc.ServicerContext) -> pb.TraceReply:
        _check_name(request.job, "job", context)
        if request.start_step >= 0:
            if request.end_step < request.start_step:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"steps {request.start_step}-{request.end_step}: the end is before "
                              "the start")
        elif request.next_steps <= 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "give a step range (start_step..end_step) or next_steps > 0")
        try:
            trace_id, delivered, missing = self.request_trace(
                request.job, list(request.ranks), request.start_step, request.end_step,
                request.next_steps, request.reason or "operator")
        except ValueError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return pb.TraceReply(trace_id=trace_id, ranks=delivered, missing=missing)

    def request_trace(self, job: str, ranks: list[int], start_step: int, end_step: int,
                      next_steps: int, reason: str) -> tuple[str, list[int], list[int]]:
        """Send a deep-trace command to ``ranks`` of ``job`` (all its ranks when empty)."""
        trace_id = uuid.uuid4().hex[:12]
        cmd = pb.Command(id=trace_id, kind="trace", start_step=start_step if start_step >= 0 else -1,
                         end_step=end_step if start_step >= 0 else -1,
                         next_steps=next_steps if start_step < 0 else 0)
        ranks, delivered, missing = self.send_command(job, ranks, cmd)
        self.store.add_trace_request(trace_id, job, ranks, start_step, end_step, next_steps, reason)
        what = f"steps {start_step}-{end_step}" if start_step >= 0 else f"the next {next_steps} steps"
        self._log(f"trace {trace_id} requested ({reason}): job {job} ranks "
                  f"{','.join(map(str, ranks))}, {what}")
        self._broadcast({"type": "trace_request", "trace_id": trace_id, "job": job,
                         "ranks": ranks, "start_step": start_step,
                         "end_step": end_step, "next_steps": next_steps, "reason": reason})
        return trace_id, delivered, missing

    def send_command(self, job: str, ranks: list[int],
                     cmd: pb.Command) -> tuple[list[int], list[int], list[int]]:
        """Queue ``cmd`` for ``ranks`` of ``job`` (all its ranks when empty).

        A rank not connected now gets it when its command stream opens. Returns (ranks,
        delivered now, waiting); ValueError when the job has no ranks to send to.
        """
        if not ranks:
            with self._ranks_lock:
                ranks = [r for (j, r) in self._ranks if j == job]
            ranks = ranks or [r for (r,) in self.store.rows(
                "SELECT rank FROM ranks WHERE job = ?", [job])]
        if not ranks:
            raise ValueError(f"job {job!r} has no registered ranks; check the name with "
                             "'probe monitor status'")
        ranks = sorted(set(ranks))
        delivered, missing = [], []
        for rank in ranks:
            with self._ranks_lock:
                st = self._ranks.get((job, rank))
                if st is not None and st.connected:
                    st.commands.put(cmd)
                    delivered.append(rank)
                else:
                    self._undelivered.setdefault((job, rank), []).append(cmd)
                    missing.append(rank)
        return ranks, delivered, missing

    def SendCommand(self, request: pb.CommandRequest, context: grpc.ServicerContext) -> pb.TraceReply:
        _check_name(request.job, "job", context)
        if request.kind == "set_interval":
            if not 0.001 <= request.interval_s <= 3600:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"interval {request.interval_s} s: give 0.001 to 3600 seconds")
        elif request.kind != "stop_trace":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown command {request.kind!r}: use stop_trace or set_interval")
        cmd = pb.Command(id=uuid.uuid4().hex[:12], kind=request.kind, interval_s=request.interval_s,
                         trace_id=request.trace_id)
        try:
            _, delivered, missing = self.send_command(request.job, list(request.ranks), cmd)
        except ValueError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return pb.TraceReply(trace_id=cmd.id, ranks=delivered, missing=missing)

    def FetchTrace(self, request: pb.FetchTraceRequest,
                   context: grpc.ServicerContext) -> Iterator[pb.TraceChunk]:
        rows = [r for r in self.store.traces(trace_id=request.trace_id).to_pylist()
                if r["rank"] == request.rank and r["path"]]
        if not rows:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"no trace files for trace {request.trace_id} rank {request.rank}")
        for row in rows:
            with open(row["path"], "rb") as f:
                while True:
                    data = f.read(1 << 20)
                    last = len(data) < (1 << 20)
                    yield pb.TraceChunk(trace_id=row["trace_id"], job=row["job"], rank=row["rank"],
                                        filename=row["filename"], data=data, last=last,
                                        start_step=row["start_step"], end_step=row["end_step"])
                    if last:
                        break

    def Watch(self, request: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.JsonDoc]:
        q: queue.Queue = queue.Queue(maxsize=10_000)
        with self._watch_lock:
            self._watchers.append(q)
        try:
            yield pb.JsonDoc(json=json.dumps({"type": "hello", "address": self.address}))
            while context.is_active() and not self._stopping.is_set():
                try:
                    event = q.get(timeout=0.5)
                except queue.Empty:
                    continue
                if request.job and event.get("job") not in (None, request.job):
                    continue
                yield pb.JsonDoc(json=json.dumps(event, default=str))
        finally:
            with self._watch_lock:
                self._watchers.remove(q)

    def _broadcast(self, event: dict[str, Any]) -> None:
        with self._watch_lock:
            watchers = list(self._watchers)
        for q in watchers:
            try:
                q.put_nowait(event)
            except queue.Full:          # a watcher that does not read loses events, not the service
                pass

    # -- background threads --------------------------------------------------------------------

    def _writer_loop(self) -> None:
        stop = False
        while not stop:
            item = self._writes.get()
            if item is None:
                break
            group, points = [item], item.table.num_rows
            while points < MAX_GROUP_POINTS:
                try:
                    nxt = self._writes.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
                points += nxt.table.num_rows
            try:
                fresh = self.store.ingest([p.key for p in group], [p.table for p in group])
                for p, f in zip(group, fresh):
                    p.fresh = f
                    if f:
                        self.points_ingested += p.table.num_rows
            except Exception as e:  # noqa: BLE001 - tell every waiting caller; they resend
                for p in group:
                    p.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            for p in group:
                p.done.set()

    def _detector_loop(self) -> None:
        while not self._stopping.wait(self.detect_interval_s):
            try:
                self.detect_once()
            except Exception as e:  # noqa: BLE001 - detection must never stop ingest
                self._broadcast({"type": "error", "message": f"detector failed: {e}"})

    def detect_once(self) -> list[dict[str, Any]]:
        """Run the detectors on every job's newly complete steps; returns the new alerts."""
        now = time.time()
        raised: list[dict[str, Any]] = []
        with self._ranks_lock:
            states = list(self._ranks.values())
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
        self._log(f"alert #{alert['id']} {alert['kind']} job {alert['job']}: {alert['message']}")
        self._broadcast(dict(alert, type="alert"))
        n = self.trace_on_alert.get(alert["kind"])
        key = (alert["job"], alert["rank"], alert["kind"])
        if n and alert.get("rank") is not None and key not in self._triggered:
            self._triggered.add(key)
            self.request_trace(alert["job"], [alert["rank"]], -1, -1, n,
                               f"alert {alert['id']} ({alert['kind']})")
        return alert


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for tests and ``--port 0`` callers)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_trace_on_alert(specs: list[str] | tuple[str, ...]) -> dict[str, int]:
    """``["straggler:5"]`` -> ``{"straggler": 5}`` (alert kind : steps to trace).

    >>> parse_trace_on_alert(["straggler:5", "slow_step:2"])
    {'straggler': 5, 'slow_step': 2}
    """
    out = {}
    for spec in specs:
        kind, _, n = spec.partition(":")
        if kind not in ("straggler", "slow_step", "nonfinite", "rank_lost") or not n.isdigit() \
                or int(n) <= 0:
            raise ProbeError(f"--trace-on-alert {spec!r}: use KIND:STEPS with KIND one of "
                             "straggler, slow_step, nonfinite, rank_lost and STEPS > 0")
        out[kind] = int(n)
    return out


def serve_path_default() -> Path:
    """The default store file: ``runs/monitor/monitor.duckdb`` under the current directory."""
    return Path("runs") / "monitor" / "monitor.duckdb"
