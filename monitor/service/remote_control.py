"""The service's commands to ranks: deep traces, targeted dumps, stacks and settings, queued
for each rank's command stream (:mod:`probe.monitor.service.ranks`), and the reactions to new alerts.

:class:`RemoteControl` is a part of :class:`probe.monitor.service.server.MonitorService` (its gRPC calls
``RequestTrace``, ``RequestDump``, ``SendCommand`` and their Python twins); it uses the
service's ``store``, ``ranks``, ``watchers``, ``_log`` and its ``dump_on_alert`` settings.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import grpc

from probe.monitor.alert_kinds import alert_kind
from probe.monitor.limits import check_name
from probe.monitor.proto import monitor_pb2 as pb
from probe.monitor.service.watchers import Watchers
from probe.monitor.targeted_dump import check_order, module_scope


class RemoteControl:
    """Commands to the ranks of a job (a mixin of :class:`probe.monitor.service.server.MonitorService`)."""

    def RequestTrace(self, request: pb.TraceRequest, context: grpc.ServicerContext) -> pb.TraceReply:
        check_name(request.job, "job", context)
        _check_steps(request, context)
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
        self.watchers.broadcast({"type": "trace_request", "trace_id": trace_id, "job": job,
                         "ranks": ranks, "start_step": start_step,
                         "end_step": end_step, "next_steps": next_steps, "reason": reason})
        return trace_id, delivered, missing

    def RequestDump(self, request: pb.DumpRequest, context: grpc.ServicerContext) -> pb.TraceReply:
        check_name(request.job, "job", context)
        _check_steps(request, context)
        why = check_order(request.task or "statistics", request.level or "module", request.scope)
        if why:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        try:
            dump_id, delivered, missing = self.request_dump(
                request.job, list(request.ranks), request.start_step, request.end_step,
                request.next_steps, scope=request.scope, task=request.task or "statistics",
                level=request.level or "module", reason=request.reason or "operator")
        except ValueError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return pb.TraceReply(trace_id=dump_id, ranks=delivered, missing=missing)

    def request_dump(self, job: str, ranks: list[int], start_step: int, end_step: int,
                     next_steps: int, *, scope: str = "", task: str = "statistics",
                     level: str = "module", reason: str = "operator", alert_id: int | None = None,
                     module: str = "") -> tuple[str, list[int], list[int]]:
        """Send a targeted-dump command to ``ranks`` of ``job`` (all its ranks when empty)."""
        dump_id = uuid.uuid4().hex[:12]
        ranged = start_step >= 0
        cmd = pb.Command(id=dump_id, kind="dump", start_step=start_step if ranged else -1,
                         end_step=end_step if ranged else -1,
                         next_steps=0 if ranged else next_steps, scope=scope, task=task,
                         level=level)
        ranks, delivered, missing = self.send_command(job, ranks, cmd)
        self.store.add_dump_request(dump_id, job, ranks, start_step if ranged else -1,
                                    end_step if ranged else -1, 0 if ranged else next_steps,
                                    scope, task, level, reason, alert_id, module)
        what = f"steps {start_step}-{end_step}" if ranged else f"the next {next_steps} steps"
        self._log(f"dump {dump_id} requested ({reason}): job {job} ranks "
                  f"{','.join(map(str, ranks))}, {what}, {task} of {scope or 'every module'}")
        self.watchers.broadcast({"type": "dump_request", "dump_id": dump_id, "job": job,
                                 "ranks": ranks, "start_step": start_step, "end_step": end_step,
                                 "next_steps": next_steps, "scope": scope, "task": task,
                                 "level": level, "reason": reason, "alert_id": alert_id})
        return dump_id, delivered, missing

    def _on_alert(self, alert: dict[str, Any]) -> None:
        """A new alert (on the detector thread): with ``dump_on_alert``, an alert of a kind that
        ``dumps`` (:mod:`probe.monitor.alert_kinds`: the numerics kinds) dumps its module on its
        rank for the next N steps (once per job, rank and module)."""
        kind = alert_kind(str(alert.get("kind", "")))
        if not self.dump_on_alert or kind is None or not kind.dumps:
            return
        ev = alert.get("evidence") or {}
        module = alert.get("module") or (ev.get("module") if isinstance(ev, dict) else None)
        rank = alert.get("rank")
        if not module or rank is None:
            return
        key = (alert["job"], rank, module)
        if key in self._dumped_for:
            return
        self._dumped_for.add(key)
        try:
            self.request_dump(alert["job"], [int(rank)], -1, -1, self.dump_on_alert,
                              scope=module_scope(module), task=self.dump_on_alert_task,
                              reason=f"alert {alert.get('id')} ({alert['kind']} {module})",
                              alert_id=alert.get("id"), module=module)
        except ValueError as e:
            self._log(f"cannot ask for a dump on alert {alert.get('id')}: {e}")

    def dump_stacks(self, job: str, request: str) -> None:
        """Ask every rank of ``job`` to dump its Python stacks; the files come back as the
        trace ``request`` (``probe monitor trace-files --trace <request>``)."""
        cmd = pb.Command(id=request, kind="dump_stacks", trace_id=request)
        ranks, _, _ = self.send_command(job, [], cmd)
        self.store.add_trace_request(request, job, ranks, -1, -1, 0, "stacks on hang")
        self._log(f"stacks {request} requested: job {job} ranks {','.join(map(str, ranks))}")

    def send_command(self, job: str, ranks: list[int],
                     cmd: pb.Command) -> tuple[list[int], list[int], list[int]]:
        """Queue ``cmd`` for ``ranks`` of ``job`` (all its ranks when empty).

        A rank not connected now gets it when its command stream opens. Returns (ranks,
        delivered now, waiting); ValueError when the job has no ranks to send to.
        """
        if not ranks:
            ranks = self.ranks.ranks_of(job) or [r for (r,) in self.store.rows(
                "SELECT rank FROM ranks WHERE job = ?", [job])]
        if not ranks:
            raise ValueError(f"job {job!r} has no registered ranks; check the name with "
                             "'probe monitor status'")
        ranks = sorted(set(ranks))
        delivered, missing = [], []
        for rank in ranks:
            (delivered if self.ranks.send(job, rank, cmd) else missing).append(rank)
        return ranks, delivered, missing

    def SendCommand(self, request: pb.CommandRequest, context: grpc.ServicerContext) -> pb.TraceReply:
        check_name(request.job, "job", context)
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


class AlertHook(Watchers):
    """The watchers, and ``on_alert(event)`` for each new alert told to them (the service's
    reactions to alerts that the detector thread does not make itself: a targeted dump)."""

    def __init__(self, on_alert: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._on_alert = on_alert

    def broadcast(self, event: dict[str, Any]) -> None:
        super().broadcast(event)
        if event.get("type") == "alert":
            try:
                self._on_alert(event)
            except Exception as e:  # noqa: BLE001 - never in the detector thread's way
                super().broadcast({"type": "error", "message": f"on alert {event.get('id')}: {e}"})


def _check_steps(request: Any, context: grpc.ServicerContext) -> None:
    """A trace or dump request names a step range (start <= end) or a number of next steps."""
    if request.start_step >= 0:
        if request.end_step < request.start_step:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"steps {request.start_step}-{request.end_step}: the end is before "
                          "the start")
    elif request.next_steps <= 0:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      "give a step range (start_step..end_step) or next_steps > 0")
