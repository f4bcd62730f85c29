"""The monitor service: one gRPC server that ingests metric batches, detects, and commands ranks.

Ranks (:mod:`probe.monitor.agent.monitor_agent`) register, push columnar metric batches and hold a
command stream open; operators (:mod:`probe.monitor.client`, ``probe monitor``, the web UI) query
status, alerts, metrics and traces, request deep traces, and watch alerts live. One process owns the
DuckDB store (:mod:`probe.monitor.service.storage`), writes it and answers queries from it.

:class:`MonitorService` is the gRPC servicer: it checks each call and hands it to the room that
does the work:

- :mod:`probe.monitor.service.ingest`: ``Push`` decodes a batch into Arrow; the writer thread
  inserts every batch waiting in one transaction (group commit) and acks: an ack means durable, and
  a batch resent after a lost ack is acknowledged without being stored again;
- :mod:`probe.monitor.service.ranks`: who registered each rank, and the commands waiting for it;
- :mod:`probe.monitor.service.detection`: the detector thread judges each job's newly complete steps
  (every live rank reported) and watches for hangs (from the collective each rank's batches and
  heartbeats say it is in), keeps one alert open per cause and pushes them to watchers
  (:mod:`probe.monitor.service.watchers`); a configured alert kind can trigger a deep trace on the
  rank it names, and a hang (``stacks_on_hang``) every rank's Python stacks;
- :mod:`probe.monitor.service.trace_upload`: trace files uploaded by ranks (fetched by operators as
  :func:`probe.monitor.trace_transfer.file_chunks`);
- :mod:`probe.monitor.service.remote_control`: the commands to ranks (deep traces, dumps, settings);
- :mod:`probe.monitor.targeted_dump`: ``RequestDump`` queues a ``dump`` command for ranks (a dump of
  chosen modules for chosen steps, no restart); each rank's ``ReportDump`` says where it wrote
  it; with ``dump_on_alert=N`` a new numerics alert dumps its rank's module for the next N steps;
- :mod:`probe.monitor.service.status`: the status document;
- :mod:`probe.monitor.service.otlp_metrics` (``otlp=True``): each stored batch also becomes
  OpenTelemetry metrics, exported over OTLP every few seconds.

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
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pyarrow as pa

from probe.ground.errors import ProbeError
from probe.monitor import auth
from probe.monitor.alert_kinds import kind_names
from probe.monitor.limits import MAX_BATCH_POINTS, MAX_MESSAGE_BYTES, MAX_NAME_LEN, check_name
from probe.monitor.proto import monitor_pb2 as pb
from probe.monitor.proto import monitor_pb2_grpc as pb_grpc
from probe.monitor.service.detection import Detection
from probe.monitor.service.ingest import IngestWriter, decode_batch
from probe.monitor.service.ranks import RankRegistry, RankState
from probe.monitor.service.remote_control import AlertHook, RemoteControl
from probe.monitor.service.status import status_document
from probe.monitor.service.storage import BatchKey, MonitorStore
from probe.monitor.service.trace_upload import receive_upload
from probe.monitor.trace_transfer import file_chunks

#: The largest query answer sent in one reply (bytes).
MAX_REPLY_BYTES = 60 * 1024 * 1024
#: Seconds without a batch or heartbeat after which a rank is "lost" (and alerted).
LOST_AFTER_S = 15.0


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


class MonitorService(RemoteControl, pb_grpc.MonitorServicer):
    """The gRPC monitor: see the module docstring. ``start()`` binds; ``stop()`` shuts down.

    Each connected rank holds one server thread for its command stream; threads are made on
    demand up to ``max_workers``, so the default serves a couple of thousand ranks.
    """

    def __init__(self, store_path: str | os.PathLike = "monitor.duckdb", host: str = "127.0.0.1",
                 port: int = 50051, token: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, trace_on_alert: dict[str, int] | None = None,
                 detect_interval_s: float = 0.25, max_workers: int = 4096,
                 lost_after_s: float = LOST_AFTER_S, stacks_on_hang: bool = False,
                 log: Callable[[str], None] | None = None, otlp: Any = None,
                 dump_on_alert: int = 0, dump_on_alert_task: str = "statistics") -> None:
        auth.check_bind(host, token)
        self.host, self.port, self.token = host, port, token
        self._creds = auth.server_credentials(tls_cert, tls_key)
        self.store = MonitorStore(store_path)
        self.detect_interval_s = detect_interval_s
        self.max_workers = max_workers
        self.lost_after_s = lost_after_s
        self._log = log or (lambda line: None)
        self.ranks = RankRegistry()
        self.watchers = AlertHook(self._on_alert)
        self.dump_on_alert, self.dump_on_alert_task = int(dump_on_alert or 0), dump_on_alert_task
        self._dumped_for: set[tuple] = set()
        self.writer = IngestWriter(self.store, capacity=max_workers)
        # After a restart, detect on new steps only, and do not repeat alerts already raised.
        self.detection = Detection(self.store, self.ranks, self.watchers,
                                   lost_after_s=lost_after_s,
                                   trace_on_alert=dict(trace_on_alert or {}),
                                   request_trace=self.request_trace, log=self._log,
                                   dump_stacks=self.dump_stacks if stacks_on_hang else None)
        self._stopping = threading.Event()
        self._server: grpc.Server | None = None
        self.started = time.time()
        # otlp: True exports stored metrics over OTLP (OTEL_EXPORTER_OTLP_*); or an OtlpMetrics
        self.otlp = None
        self.otlp_errors = 0
        if otlp is True:
            from probe.monitor.service.otlp_metrics import OtlpMetrics

            self.otlp = OtlpMetrics(address=f"{host}:{port}")
        elif otlp:
            self.otlp = otlp

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
        self.writer.start()
        self.detection.start(self.detect_interval_s)
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
        self.writer.close(timeout=10)
        self.detection.stop(timeout=10)
        self.store.close()
        if self.otlp is not None:
            self.otlp.close()

    @property
    def address(self) -> str:
        """``host:port`` the service listens on."""
        return f"{self.host}:{self.port}"

    @property
    def points_ingested(self) -> int:
        """Points stored since the service started (resent batches not counted twice)."""
        return self.writer.points_ingested

    def detect_once(self) -> list[dict[str, Any]]:
        """Run the detectors on every job's newly complete steps now; returns the new alerts."""
        return self.detection.detect_once()

    # -- rank side -----------------------------------------------------------------------------

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        check_name(request.job, "job", context)
        check_name(request.agent_id, "agent_id", context)
        if request.rank < 0 or request.world_size < 0 or (request.world_size and
                                                           request.rank >= request.world_size):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"rank {request.rank} does not fit world size {request.world_size}")
        replaced = self.store.register_rank(request.job, request.rank, request.world_size,
                                            request.host[:MAX_NAME_LEN], request.pid,
                                            request.engine[:MAX_NAME_LEN], request.agent_id)
        replaced = self.ranks.register(request.job, request.rank, agent_id=request.agent_id,
                                       world_size=request.world_size, host=request.host,
                                       pid=request.pid, engine=request.engine) or replaced
        msg = "registered again; the earlier agent of this rank is replaced" if replaced else "registered"
        self._log(f"job {request.job} rank {request.rank}/{request.world_size} {msg} "
                  f"({request.host}:{request.pid}, {request.engine or 'engine?'})")
        return pb.RegisterReply(accepted=True, message=msg, max_batch_points=MAX_BATCH_POINTS,
                                replaced=replaced)

    def Push(self, request: pb.MetricBatch, context: grpc.ServicerContext) -> pb.PushAck:
        check_name(request.job, "job", context)
        check_name(request.agent_id, "agent_id", context)
        if request.rank < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rank {request.rank} is negative")
        st = self.ranks.state(request.job, request.rank)
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
        item = self.writer.write(BatchKey(request.job, request.rank, request.agent_id,
                                          request.seq, request.dropped, last), table)
        if item.error:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"the store could not take the batch ({item.error}); resend it")
        self._seen(st, request, last)
        if item.fresh:
            self.detection.mark(request.job)
            if self.otlp is not None:
                try:
                    self.otlp.record(table)
                except Exception as e:  # noqa: BLE001 - the store has it; OTLP is a copy
                    self.otlp_errors += 1
                    if self.otlp_errors == 1:
                        self._log(f"OTLP metrics: {type(e).__name__}: {e}")
        return pb.PushAck(seq=request.seq, duplicate=not item.fresh,
                          stored=table.num_rows if item.fresh else 0)

    def _seen(self, st: RankState, request: pb.MetricBatch, last_step: int) -> None:
        if request.reports_collectives:
            p = request.pending
            pending = None if not p.op else {
                "op": p.op[:MAX_NAME_LEN], "seq": int(p.seq), "group": p.group[:MAX_NAME_LEN],
                "bytes": int(p.bytes), "group_size": int(p.group_size), "peer": int(p.peer),
                "waiting_s": float(p.waiting_s)}
            entered = {g[:MAX_NAME_LEN]: int(n) for g, n in list(request.entered.items())[:64]}
            st.report(int(request.step_in), pending, entered, time.time())
        st.last_seen = time.time()
        st.last_step = max(st.last_step, last_step)
        st.lost_alerted = False
        if request.final and not st.final:
            st.final = True
            self.store.mark_finished(st.job, st.rank)
            self.detection.mark(st.job)

    def Commands(self, request: pb.CommandStreamRequest,
                 context: grpc.ServicerContext) -> Iterator[pb.Command]:
        check_name(request.job, "job", context)
        commands = self.ranks.open_stream(request.job, request.rank, request.agent_id)
        if commands is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this agent is not the registered one for the rank; register first")
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
            self.ranks.close_stream(request.job, request.rank, commands)

    def UploadTrace(self, request_iterator: Iterator[pb.TraceChunk],
                    context: grpc.ServicerContext) -> pb.TraceAck:
        return receive_upload(request_iterator, context, self.store, log=self._log,
                              broadcast=self.watchers.broadcast)

    def ReportDump(self, request: pb.DumpReport, context: grpc.ServicerContext) -> pb.TraceAck:
        check_name(request.dump_id, "dump_id", context)
        check_name(request.job, "job", context)
        self.store.add_dump_report(request.dump_id, request.job, request.rank, request.start_step,
                                   request.end_step, request.path[:4096], list(request.steps)[:100_000],
                                   request.files, request.bytes, request.error[:2000])
        what = (f"no dump: {request.error[:200]}" if request.error else
                f"steps {','.join(map(str, request.steps))} in {request.path} "
                f"({request.files} files, {request.bytes} bytes)")
        self._log(f"dump {request.dump_id} job {request.job} rank {request.rank}: {what}")
        self.watchers.broadcast({"type": "dump", "dump_id": request.dump_id, "job": request.job,
                                 "rank": request.rank, "path": request.path,
                                 "steps": list(request.steps), "error": request.error})
        return pb.TraceAck(ok=True, bytes=request.bytes, message="recorded")

    # -- operator side -------------------------------------------------------------------------

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.JsonDoc:
        return pb.JsonDoc(json=json.dumps(self.status(request.job or None), default=str))

    def status(self, job: str | None = None) -> dict[str, Any]:
        """The status document (:mod:`probe.monitor.service.status`): service, ``jobs[].ranks[]``, ``alerts[]``."""
        service = {"address": self.address, "store": str(self.store.path),
                   "uptime_s": round(time.time() - self.started, 3),
                   "points_ingested": self.points_ingested, "auth": bool(self.token),
                   "tls": self._creds is not None}
        return status_document(self.store, self.ranks, job, lost_after_s=self.lost_after_s,
                               judged_step=self.detection.judged_step, service=service,
                               open_hang=self.detection.open_hang)

    def Alerts(self, request: pb.AlertsRequest, context: grpc.ServicerContext) -> pb.ArrowTable:
        return _ipc(self.store.alerts(request.job or None, request.since_id, request.kind or None),
                    context)

    def Metrics(self, request: pb.MetricsRequest, context: grpc.ServicerContext) -> pb.ArrowTable:
        return _ipc(self.store.metrics(request.job or None, request.since_step, list(request.ranks),
                                       list(request.names), request.pivot, request.limit), context)

    def Traces(self, request: pb.TracesRequest, context: grpc.ServicerContext) -> pb.ArrowTable:
        return _ipc(self.store.traces(request.job or None, request.trace_id or None), context)

    def Dumps(self, request: pb.DumpsRequest, context: grpc.ServicerContext) -> pb.ArrowTable:
        return _ipc(self.store.dumps(request.job or None, request.dump_id or None), context)

    def FetchTrace(self, request: pb.FetchTraceRequest,
                   context: grpc.ServicerContext) -> Iterator[pb.TraceChunk]:
        rows = [r for r in self.store.traces(trace_id=request.trace_id).to_pylist()
                if r["rank"] == request.rank and r["path"]]
        if not rows:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"no trace files for trace {request.trace_id} rank {request.rank}")
        for row in rows:
            yield from file_chunks(row["path"], trace_id=row["trace_id"], job=row["job"],
                                   rank=row["rank"], filename=row["filename"],
                                   start_step=row["start_step"], end_step=row["end_step"])

    def Watch(self, request: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.JsonDoc]:
        with self.watchers.watching() as events:
            yield pb.JsonDoc(json=json.dumps({"type": "hello", "address": self.address}))
            while context.is_active() and not self._stopping.is_set():
                try:
                    event = events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if request.job and event.get("job") not in (None, request.job):
                    continue
                yield pb.JsonDoc(json=json.dumps(event, default=str))


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
    kinds = kind_names()
    for spec in specs:
        kind, _, n = spec.partition(":")
        if kind not in kinds or not n.isdigit() or int(n) <= 0:
            raise ProbeError(f"--trace-on-alert {spec!r}: use KIND:STEPS with KIND one of "
                             f"{', '.join(kinds)} and STEPS > 0")
        out[kind] = int(n)
    return out


def serve_path_default() -> Path:
    """The default store file: ``runs/monitor/monitor.duckdb`` under the current directory."""
    return Path("runs") / "monitor" / "monitor.duckdb"
