"""The public client of the monitor service, used by ``probe monitor`` and the web UI.

Every query returns plain data: Arrow tables (``.to_pylist()`` gives lists of dicts) or a dict.

===============================  ===================================================================
``MonitorClient(addr, token)``   ``addr`` = ``host:port`` (default env ``PROBE_MONITOR``, then
                                 ``127.0.0.1:50051``); ``token`` default env ``PROBE_MONITOR_TOKEN``;
                                 ``ca`` (TLS) default env ``PROBE_MONITOR_CA``.
``status(job=None)``             dict: ``service``; ``jobs[]`` (job, world_size, last_step, health,
                                 alerts {kind: count}, judged_step (the detectors have judged
                                 every step up to it), ``ranks[]``: rank, host, pid, engine,
                                 health ok|stale|lost|finished, last_step, last_seen_s, points,
                                 batches, dropped, registrations, connected); ``alerts[]`` (id,
                                 time_ns, job, kind, rank, step, message, evidence dict);
                                 ``traces[]`` (collected trace files).
``ranks(job=None)``              Arrow table, one row per rank: job + the ``ranks[]`` fields above.
``steps(job, since_step=0)``     Arrow table, one row per (rank, step): job, rank, step, time_ns and
                                 one float column per metric (loss, step_time_ms, tokens_per_s,
                                 compute_time_ms, comm_time_ms, data_time_ms, grad_norm, ...).
``metrics(job, since_step=0,     Arrow table of points: time_ns, job, rank, step, name, value
ranks=(), names=())``            (``pivot=True``: as ``steps``).
``alerts(job=None, since_id=0,   Arrow table: id, time_ns, job, kind (straggler | slow_step |
kind=None)``                     nonfinite | rank_lost), rank, step, message, evidence (JSON text).
``request_trace(job, ranks,      Ask ranks for a deep trace of ``steps`` (``"120-124"``, a
steps=None, next_steps=None)``   (start, end) pair) or of the next ``next_steps`` steps; returns
                                 {trace_id, ranks (delivered), missing (not connected yet)}.
``traces(job=None,               Arrow table of collected files: trace_id, job, rank, start_step,
trace_id=None)``                 end_step, filename, path (on the service's machine), bytes,
                                 error, time_ns.
``stop_trace(job, ranks=None,     End running deep traces after the current step (the ranks send
trace_id=None)``                 what they recorded); returns {id, ranks, missing}.
``set_interval(job, seconds,     Change how often the agents send batches.
ranks=None)``
``wait_trace(trace_id, ranks,    Wait until every rank has sent its files (or an error).
timeout)``
``fetch_trace(trace_id, rank,    Copy one rank's trace files from the service into ``out_dir``.
out_dir)``
``request_dump(job, ranks,       Ask ranks for a targeted dump (``monitor.targeted_dump``) of
steps=None, next_steps=None,     ``steps`` or the next ``next_steps`` steps, of the entries ``scope``
scope="", task="statistics",     matches; returns {dump_id, ranks, missing}.
level="module")``
``dumps(job=None, dump_id=None)``  Arrow table, one row per (dump, rank): the request and the rank's
                                 report (path on the rank's machine, steps JSON, files, bytes,
                                 error, state pending | done | failed).
``wait_dump(dump_id, timeout)``  Wait until every rank asked has reported; the dump's rows.
``watch(job=None)``              Iterator of live events (dicts): ``type`` alert | alert_update |
                                 trace | trace_request | dump_request | dump | hello.
===============================  ===================================================================

Errors are :class:`probe.ground.errors.ProbeError` with one line saying what to do (no service at the
address, wrong token, unknown job).

>>> c = MonitorClient("127.0.0.1:50051")                       # doctest: +SKIP
>>> c.status()["jobs"][0]["ranks"][0]["health"]                  # doctest: +SKIP
'ok'
>>> c.steps("demo", since_step=100).to_pylist()[0]["loss"]       # doctest: +SKIP
2.71
>>> c.request_trace("demo", ranks=[0, 3], steps="120-124")       # doctest: +SKIP
{'trace_id': '3f2a9c81d0be', 'ranks': [0, 3], 'missing': []}
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from probe.ground.errors import ProbeError
from probe.monitor.address import DEFAULT_ADDR, monitor_address


def resolve_addr(addr: str | None) -> str:
    """``addr``, else env ``PROBE_MONITOR``, else ``127.0.0.1:50051``; checked for ``host:port``."""
    addr = addr or monitor_address() or DEFAULT_ADDR
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ProbeError(f"monitor address {addr!r}: use HOST:PORT, e.g. 127.0.0.1:50051")
    return addr


def parse_steps(steps: str | Sequence[int] | None) -> tuple[int, int] | None:
    """``"120-124"``, ``"7"``, ``(120, 124)`` -> (first, last) inclusive.

    >>> parse_steps("120-124"), parse_steps("7"), parse_steps((3, 4))
    ((120, 124), (7, 7), (3, 4))
    """
    if steps is None:
        return None
    if isinstance(steps, str):
        text = steps.strip()
        try:
            lo, _, hi = text.partition("-")
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ProbeError(f"--steps {steps!r}: give one contiguous range such as 120-124") from None
    else:
        first, last = int(steps[0]), int(steps[-1])
    if first < 0 or last < first:
        raise ProbeError(f"--steps {steps!r}: give FIRST-LAST with 0 <= FIRST <= LAST")
    return first, last


def _table(reply: Any) -> pa.Table:
    return pa.ipc.open_stream(reply.ipc).read_all()


class MonitorClient:
    """A connection to one monitor service; see the module docstring for the calls."""

    def __init__(self, addr: str | None = None, token: str | None = None, ca: str | None = None,
                 timeout: float = 10.0) -> None:
        from probe.monitor import auth
        from probe.monitor.proto import monitor_pb2_grpc as pb_grpc

        self.addr = resolve_addr(addr)
        self.token = token if token is not None else os.environ.get(auth.TOKEN_ENV)
        self._channel = auth.open_channel(
            self.addr, ca if ca is not None else os.environ.get(auth.CA_ENV),
            [("grpc.max_receive_message_length", 256 * 1024 * 1024)])
        self._stub = pb_grpc.MonitorStub(self._channel)
        self._md = auth.token_metadata(self.token)
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "MonitorClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        import grpc

        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                                metadata=self._md)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, e: Any) -> ProbeError:
        import grpc

        code = e.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return ProbeError(f"{self.addr}: no monitor service answers; start one with "
                              "'probe monitor serve' or give its address with --addr or "
                              "PROBE_MONITOR")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ProbeError(f"{self.addr}: the monitor did not answer in time; is it overloaded?")
        return ProbeError(f"{self.addr}: {e.details()}")

    # -- queries -------------------------------------------------------------------------------

    def status(self, job: str | None = None) -> dict[str, Any]:
        from probe.monitor.proto import monitor_pb2 as pb

        return json.loads(self._call("Status", pb.StatusRequest(job=job or "")).json)

    def ranks(self, job: str | None = None) -> pa.Table:
        rows = [dict(rank, job=j["job"]) for j in self.status(job)["jobs"] for rank in j["ranks"]]
        return pa.Table.from_pylist(rows)

    def metrics(self, job: str | None = None, since_step: int = 0, ranks: Sequence[int] = (),
                names: Sequence[str] = (), pivot: bool = False, limit: int = 0) -> pa.Table:
        from probe.monitor.proto import monitor_pb2 as pb

        return _table(self._call("Metrics", pb.MetricsRequest(
            job=job or "", since_step=since_step, ranks=list(ranks), names=list(names),
            pivot=pivot, limit=limit), timeout=max(self.timeout, 60.0)))

    def steps(self, job: str | None = None, since_step: int = 0, ranks: Sequence[int] = (),
              names: Sequence[str] = ()) -> pa.Table:
        return self.metrics(job, since_step, ranks, names, pivot=True)

    def alerts(self, job: str | None = None, since_id: int = 0, kind: str | None = None) -> pa.Table:
        from probe.monitor.proto import monitor_pb2 as pb

        return _table(self._call("Alerts", pb.AlertsRequest(job=job or "", since_id=since_id,
                                                            kind=kind or "")))

    def traces(self, job: str | None = None, trace_id: str | None = None) -> pa.Table:
        from probe.monitor.proto import monitor_pb2 as pb

        return _table(self._call("Traces", pb.TracesRequest(job=job or "", trace_id=trace_id or "")))

    # -- commands ------------------------------------------------------------------------------

    def request_trace(self, job: str, ranks: Sequence[int] | None = None,
                      steps: str | Sequence[int] | None = None, next_steps: int | None = None,
                      reason: str = "operator") -> dict[str, Any]:
        """Ask ``ranks`` (all of the job's when empty) for a deep trace of ``steps`` or the next N."""
        from probe.monitor.proto import monitor_pb2 as pb

        rng = _step_range(steps, next_steps, "trace")
        req = pb.TraceRequest(job=job, ranks=list(ranks or []), reason=reason,
                              start_step=rng[0] if rng else -1, end_step=rng[1] if rng else -1,
                              next_steps=0 if rng else int(next_steps))
        reply = self._call("RequestTrace", req)
        return {"trace_id": reply.trace_id, "ranks": list(reply.ranks), "missing": list(reply.missing)}

    def stop_trace(self, job: str, ranks: Sequence[int] | None = None,
                   trace_id: str | None = None) -> dict[str, Any]:
        """End running deep traces after the current step; the ranks send what they recorded."""
        from probe.monitor.proto import monitor_pb2 as pb

        reply = self._call("SendCommand", pb.CommandRequest(job=job, ranks=list(ranks or []),
                                                            kind="stop_trace",
                                                            trace_id=trace_id or ""))
        return {"id": reply.trace_id, "ranks": list(reply.ranks), "missing": list(reply.missing)}

    def set_interval(self, job: str, seconds: float,
                     ranks: Sequence[int] | None = None) -> dict[str, Any]:
        """Change how often the ranks' agents send their batches."""
        from probe.monitor.proto import monitor_pb2 as pb

        reply = self._call("SendCommand", pb.CommandRequest(job=job, ranks=list(ranks or []),
                                                            kind="set_interval",
                                                            interval_s=seconds))
        return {"id": reply.trace_id, "ranks": list(reply.ranks), "missing": list(reply.missing)}

    def request_dump(self, job: str, ranks: Sequence[int] | None = None,
                     steps: str | Sequence[int] | None = None, next_steps: int | None = None,
                     scope: str = "", task: str = "statistics", level: str = "module",
                     reason: str = "operator") -> dict[str, Any]:
        """Ask ``ranks`` (all of the job's when empty) to dump the entries ``scope`` matches for
        ``steps`` or the next N steps (:mod:`probe.monitor.targeted_dump`)."""
        from probe.monitor.proto import monitor_pb2 as pb
        from probe.monitor.targeted_dump import check_order

        rng = _step_range(steps, next_steps, "dump")
        why = check_order(task, level, scope)
        if why:
            raise ProbeError(f"--{why}")
        req = pb.DumpRequest(job=job, ranks=list(ranks or []), reason=reason, scope=scope,
                             task=task, level=level, start_step=rng[0] if rng else -1,
                             end_step=rng[1] if rng else -1,
                             next_steps=0 if rng else int(next_steps))
        reply = self._call("RequestDump", req)
        return {"dump_id": reply.trace_id, "ranks": list(reply.ranks), "missing": list(reply.missing)}

    def dumps(self, job: str | None = None, dump_id: str | None = None) -> pa.Table:
        from probe.monitor.proto import monitor_pb2 as pb

        return _table(self._call("Dumps", pb.DumpsRequest(job=job or "", dump_id=dump_id or "")))

    def wait_dump(self, dump_id: str, timeout: float = 120.0, poll_s: float = 0.2) -> pa.Table:
        """Wait until every rank asked for ``dump_id`` has reported it (done or failed)."""
        deadline = time.monotonic() + timeout
        while True:
            table = self.dumps(dump_id=dump_id)
            rows = table.to_pylist()
            if rows and all(r["state"] != "pending" for r in rows):
                return table
            if time.monotonic() > deadline:
                missing = sorted(r["rank"] for r in rows if r["state"] == "pending")
                raise ProbeError(f"dump {dump_id}: ranks {missing} reported nothing within "
                                 f"{timeout:.0f} s; are they still training past those steps?")
            time.sleep(poll_s)

    def wait_trace(self, trace_id: str, ranks: Sequence[int], timeout: float = 120.0,
                   poll_s: float = 0.2) -> pa.Table:
        """Wait until each of ``ranks`` has sent its trace (files or an error); the trace rows."""
        deadline = time.monotonic() + timeout
        while True:
            table = self.traces(trace_id=trace_id)
            done = {r["rank"] for r in table.to_pylist()}
            if set(ranks) <= done:
                return table
            if time.monotonic() > deadline:
                missing = sorted(set(ranks) - done)
                raise ProbeError(f"trace {trace_id}: ranks {missing} sent nothing within "
                                 f"{timeout:.0f} s; are they still training past those steps?")
            time.sleep(poll_s)

    def fetch_trace(self, trace_id: str, rank: int, out_dir: str | os.PathLike) -> list[Path]:
        """Copy one rank's trace files into ``out_dir``; returns their paths."""
        import grpc

        from probe.monitor.proto import monitor_pb2 as pb
        from probe.monitor.trace_transfer import safe_relpath

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        handle = None
        try:
            for chunk in self._stub.FetchTrace(pb.FetchTraceRequest(trace_id=trace_id, rank=rank),
                                               timeout=300.0, metadata=self._md):
                if handle is None:
                    path = out / safe_relpath(chunk.filename)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    handle = open(path, "wb")
                    paths.append(path)
                handle.write(chunk.data)
                if chunk.last:
                    handle.close()
                    handle = None
        except grpc.RpcError as e:
            raise self._error(e) from None
        finally:
            if handle is not None:
                handle.close()
        return paths

    def watch(self, job: str | None = None, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Live events as dicts (``type``: alert, trace, trace_request, hello) until closed."""
        import grpc

        from probe.monitor.proto import monitor_pb2 as pb

        stream = self._stub.Watch(pb.WatchRequest(job=job or ""), timeout=timeout, metadata=self._md)
        try:
            for doc in stream:
                yield json.loads(doc.json)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED and e.code() != grpc.StatusCode.CANCELLED:
                raise self._error(e) from None
        finally:
            stream.cancel()


def _step_range(steps: Any, next_steps: int | None, verb: str) -> tuple[int, int] | None:
    """The (first, last) of ``steps``, or None when the next ``next_steps`` are asked for;
    one of the two must be given, and a count must be positive."""
    rng = parse_steps(steps)
    if rng is None and not next_steps:
        raise ProbeError(f"give the steps to {verb} (--steps 120-124) or --next N")
    if rng is not None and next_steps:
        raise ProbeError("give either --steps or --next, not both")
    if next_steps is not None and rng is None and next_steps <= 0:
        raise ProbeError(f"--next {next_steps}: give a number of steps > 0")
    return rng
