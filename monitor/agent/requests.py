"""What the service asks of a rank and what the rank sends back besides its metrics: trace
files, targeted-dump reports, its Python stacks on a hang, and the commands it receives.

:class:`AgentRequests` is a part of :class:`probe.monitor.agent.monitor_agent.MonitorAgent`: it uses
the agent's ``job``, ``rank``, ``stats``, ``_link`` (the connection), ``_uploads``/``_dump_reports``
(the queues the sender empties), ``stacks_dir``, ``step_in``, ``on_command`` and ``_warn_once``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator


class AgentRequests:
    """The agent's side of the command channel (a mixin of
    :class:`probe.monitor.agent.monitor_agent.MonitorAgent`)."""

    def upload_trace(self, trace_id: str, start_step: int, end_step: int,
                     files: list[str] | None = None, error: str = "", root: str = "") -> None:
        """Queue trace files (paths relative to ``root``; or the reason there are none) to send."""
        self._uploads.append((trace_id, start_step, end_step, list(files or []), error, root))

    def report_dump(self, dump_id: str, start_step: int, end_step: int, path: str = "",
                    steps: list[int] | None = None, files: int = 0, nbytes: int = 0,
                    error: str = "") -> None:
        """Queue the outcome of a targeted dump (:mod:`probe.monitor.targeted_dump`): the folder it
        was written to on this machine, or why there is none; the sender reports it."""
        self._dump_reports.append(dict(dump_id=dump_id, job=self.job, rank=self.rank,
                                       start_step=start_step, end_step=end_step, path=path,
                                       steps=list(steps or []), files=files, bytes=nbytes,
                                       error=error[:2000]))

    def _send_uploads(self) -> None:
        import grpc

        from probe.monitor.trace_transfer import upload_chunks

        while self._uploads:
            trace_id, start, end, files, error, root = self._uploads[0]
            try:
                chunks = upload_chunks(trace_id, self.job, self.rank, start, end, files, error,
                                       root)
                self._link.stub.UploadTrace(chunks, timeout=120.0, metadata=self._link.metadata)
            except grpc.RpcError as e:
                self._link.lost(e)
                return
            except OSError as e:
                self._warn_once(f"upload{trace_id}", f"trace {trace_id}: cannot read a file ({e})")
            self._uploads.popleft()
            self.stats["uploads"] += 1

    def _send_dump_reports(self) -> None:
        import grpc

        from probe.monitor.proto import monitor_pb2 as pb

        while self._dump_reports:
            try:
                self._link.stub.ReportDump(pb.DumpReport(**self._dump_reports[0]),
                                           timeout=self.push_timeout_s, metadata=self._link.metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self._warn_once("dump-report", f"the monitor refused a dump report: {e.details()}")
                else:
                    self._link.lost(e)
                    return
            self._dump_reports.popleft()
            self.stats["dump_reports"] += 1

    def _dump_stacks(self, request: str) -> None:
        """Write every thread's Python stack to ``stacks_dir/<request>/rank<R>.txt`` and queue
        it for the service (or the reason there is none)."""
        import faulthandler

        if not self.stacks_dir:
            self.upload_trace(request, self.step_in, self.step_in,
                              error="this rank has no folder for stacks")
            return
        folder = os.path.join(self.stacks_dir, request)
        name = f"rank{self.rank}.txt"
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, name), "w") as f:
                f.write(f"rank {self.rank} of job {self.job}, pid {os.getpid()}, step "
                        f"{self.step_in}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
                f.flush()
                faulthandler.dump_traceback(f, all_threads=True)
        except OSError as e:
            self.upload_trace(request, self.step_in, self.step_in,
                              error=f"cannot write {folder}: {e.strerror}")
            return
        self.upload_trace(request, self.step_in, self.step_in, [name], root=folder)

    def _open_commands(self) -> Iterator[Any]:
        """The rank's command stream (on the command thread)."""
        from probe.monitor.proto import monitor_pb2 as pb

        return self._link.stub.Commands(
            pb.CommandStreamRequest(job=self.job, rank=self.rank, agent_id=self.agent_id),
            metadata=self._link.metadata)

    def _command(self, cmd: Any) -> None:
        self.stats["commands"] += 1
        if cmd.kind == "dump_stacks":
            self._dump_stacks(cmd.trace_id or cmd.id)
        elif self.on_command is not None:
            try:
                self.on_command(cmd)
            except Exception as e:  # noqa: BLE001 - a bad command never stops us
                self._warn_once(f"cmd{cmd.id}", f"command {cmd.kind} failed: {e}")
