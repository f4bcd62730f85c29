"""The per-rank monitor agent: streams step metrics to the monitor service, never in the way.

The training thread calls :meth:`MonitorAgent.record` once per step: it puts one tuple on a bounded
:class:`~probe.ground.background.BackgroundQueue` and returns (no network, no disk, no lock held
across I/O). The queue's worker is the sender: every ``flush_interval_s`` (which the service's
``set_interval`` command sets) it takes what was recorded, packs it into columnar batches
(:mod:`probe.monitor.agent.batch_packer`, numbered ``seq`` 1, 2, ... per agent) and pushes them; the
service acknowledges a batch only once it is durable and acknowledges a resent one without storing
it again. While the service is away every unacknowledged batch goes to a local spool file
(:mod:`probe.monitor.agent.spool`), in order; on reconnect the spool is resent first, then deleted.
So a restart of the service (or of the rank, when the spool file is found again) neither loses nor
doubles a point. If the training thread ever outruns the sender so far that the queue fills, the
point is dropped and counted, and the count travels to the service with the next batch
(``dropped``).

The sender also samples host CPU and memory (:mod:`probe.monitor.agent.host_sampler`; at most every
``host_interval_s``, on the latest step), heartbeats when idle, and registers again after the
service was lost (:mod:`probe.monitor.agent.connection`). Every batch and heartbeat it sends says
where the rank is, when ``collectives`` is set (a
:class:`probe.engine_adapter.torch_comm.CollectiveTracker`): ``step_in`` and the collective it has
entered and not left, read off the training thread; while the rank is stuck no step ends, the
heartbeats go on, and the service sees what it waits in. A ``dump_stacks`` command writes
every thread's Python stack (:mod:`faulthandler`, from the command thread: a stuck training
thread cannot block it) to ``stacks_dir`` and sends the file back like a trace. A command thread holds the rank's command
stream open (:mod:`probe.monitor.agent.command_listener`): a ``trace`` command makes
:class:`probe.monitor.agent.callback.MonitorAgentCallback` run a profiler session for exactly the
asked steps on the training thread, and the trace files go back to the service from the sender.

>>> agent = MonitorAgent("127.0.0.1:50051", job="demo", rank=0, world_size=1)  # doctest: +SKIP
>>> agent.start()                                                                # doctest: +SKIP
>>> agent.record(0, {"loss": 2.3, "step_time_ms": 41.0})                         # doctest: +SKIP
>>> agent.close()                                                                # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable, Mapping

from probe.ground.background import BackgroundQueue
from probe.monitor.agent.batch_packer import BatchPacker
from probe.monitor.agent.command_listener import CommandListener
from probe.monitor.agent.connection import AgentConnection
from probe.monitor.agent.host_sampler import HostSampler
from probe.monitor.agent.requests import AgentRequests
from probe.monitor.agent.spool import Spool, default_spool_path
from probe.monitor.limits import MAX_BATCH_POINTS

log = logging.getLogger(__name__)

JOB_ENV = "PROBE_MONITOR_JOB"
#: The most recorded steps the sender takes in one round.
MAX_ROUND_ITEMS = 100_000


class MonitorAgent(AgentRequests):
    """Streams one rank's metric points to the monitor service; see the module docstring.

    ``on_command(cmd)`` is called on the command thread for each command received.
    """

    def __init__(self, addr: str, job: str, rank: int, world_size: int = 0, engine: str = "",
                 *, token: str | None = None, ca: str | None = None,
                 spool_path: str | os.PathLike | None = None, queue_size: int = 65_536,
                 flush_interval_s: float = 0.2, max_batch_points: int = 16_384,
                 sample_host: bool = True, on_command: Callable[[Any], None] | None = None,
                 push_timeout_s: float = 10.0, exit_wait_s: float = 5.0,
                 host_interval_s: float = 1.0, max_spool_bytes: int = 1 << 30) -> None:
        from probe.monitor import auth

        self.addr, self.job, self.rank = addr, job, int(rank)
        self.world_size, self.engine = int(world_size), engine
        self.agent_id = uuid.uuid4().hex
        self.token = token if token is not None else os.environ.get(auth.TOKEN_ENV)
        self.ca = ca if ca is not None else os.environ.get(auth.CA_ENV)
        self._warned: set[str] = set()
        self.spool = Spool(spool_path or default_spool_path(
            job, rank, warn=self._say), max_spool_bytes)
        self._packer = BatchPacker(job, self.rank, self.agent_id, max_points=max_batch_points,
                                   warn=self._warn_once)
        self.sample_host = sample_host
        self.on_command = on_command
        self.push_timeout_s = push_timeout_s
        self.exit_wait_s = exit_wait_s
        self.flush_interval_s = flush_interval_s
        # The sender keeps its own time (each round ends waiting flush_interval_s), so the
        # queue's worker never waits for a record: one that woke it would have the sender take
        # the interpreter inside the training step.
        self._queue: BackgroundQueue[tuple[int, int, Mapping[str, Any]]] = BackgroundQueue(
            self._round, name=f"monitor-agent-r{self.rank}", capacity=queue_size,
            overflow="drop", interval_s=0, max_batch=MAX_ROUND_ITEMS,
            on_error=self._sender_error, start=False)
        self._uploads: deque = deque()
        self._dump_reports: deque = deque()     # targeted dumps done (or refused), to report
        self._unacked: deque = deque()          # batches in memory, not yet acknowledged
        self._spooling = self.spool.exists()    # batches go to the spool file until it drains
        self._dropped = 0
        self._dropped_reported = 0
        self._stop = threading.Event()
        self._final_made = False
        self._exit_deadline: float | None = None
        self._finished = False
        self._replayed = 0                      # spool records already acknowledged
        self._link = AgentConnection(addr, job=job, rank=self.rank, world_size=self.world_size,
                                     engine=engine, agent_id=self.agent_id, token=self.token,
                                     ca=self.ca, say=self._say,
                                     lost_note=f"spooling to {self.spool.path}",
                                     on_lost=self._to_spool)
        self._last_push = 0.0
        self._commands = CommandListener(self._open_commands, self._command,
                                         connected=lambda: self._link.connected, stop=self._stop,
                                         name=f"monitor-cmd-r{self.rank}")
        self._host = HostSampler(host_interval_s)
        self._last_step = -1
        self.collectives: Any = None            # a CollectiveTracker, set by the training side
        self.step_in = -1                       # the step the training thread is in
        self.stacks_dir: str | None = None      # where a dump_stacks command writes
        self.stats = {"points": 0, "acked_points": 0, "batches": 0, "acked_batches": 0,
                      "duplicates": 0, "spooled_batches": 0, "resent_batches": 0,
                      "reconnects": 0, "rejected_batches": 0, "commands": 0, "uploads": 0,
                      "dump_reports": 0,
                      "sender_cpu_s": 0.0}

    # -- the training thread's side ------------------------------------------------------------

    def start(self) -> "MonitorAgent":
        """Start the sender thread (connecting happens there, never here)."""
        self._queue.start()
        return self

    def record(self, step: int, metrics: Mapping[str, Any], time_ns: int | None = None) -> bool:
        """Queue one step's metrics (non-numeric values are skipped later); never blocks.

        Returns False when ``queue_size`` steps are already waiting (or the agent is closed):
        the points are dropped and counted, and the count reaches the service with the next
        batch.
        """
        try:
            if self._queue.put((step, time_ns or time.time_ns(), metrics)):
                return True
        except RuntimeError:                    # recorded after close(): nothing sends it
            pass
        self._dropped += len(metrics)
        return False

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued and stop; waits up to ``timeout``.

        What the service has not acknowledged after ``exit_wait_s`` stays in the spool file,
        for the next agent of this job and rank to send.
        """
        self._stop.set()
        self._queue.close(timeout)

    @property
    def dropped(self) -> int:
        """Points dropped so far (the queue was full, or the spool was while the service was away)."""
        return self._dropped

    @property
    def uploading(self) -> bool:
        """Trace files are queued or being sent (on the sender thread, which takes CPU time)."""
        return bool(self._uploads)

    # -- the sender thread ---------------------------------------------------------------------

    def _round(self, items: list) -> None:
        """One round of the sender: pack what was recorded, send, then wait for the next round
        (or finish)."""
        if self._finished:
            return
        stopping = self._stop.is_set()
        if stopping and self._exit_deadline is None:
            self._exit_deadline = time.monotonic() + self.exit_wait_s
        final = stopping and not len(self._queue)
        self._pack(items, final=final)
        self._send()
        self.stats["sender_cpu_s"] = time.thread_time()
        if final:
            self._finish()
        else:
            self._stop.wait(self.flush_interval_s)    # the next round's steps gather meanwhile

    def _finish(self) -> None:
        """The last round: wait up to ``exit_wait_s`` for every ack, else keep the rest spooled."""
        while not (self._link.connected and not self._unacked and not self._spooling):
            if time.monotonic() > self._exit_deadline:
                self._to_spool()
                if self._unacked or self._spooling:
                    self._say(f"service at {self.addr} unreachable at exit; "
                              f"{self.stats['points'] - self.stats['acked_points']} points kept "
                              f"in {self.spool.path} (sent on the next run with this spool)")
                break
            time.sleep(0.02)                      # waiting for the service; do not spin
            self._pack([])
            self._send()
        else:
            self._send_uploads()
            self._send_dump_reports()
        self.stats["sender_cpu_s"] = time.thread_time()
        self._finished = True
        self._link.close()

    def _sender_error(self, error: BaseException) -> None:
        self._warn_once("sender", f"the sender failed ({type(error).__name__}: {error}); the "
                                  f"points of that round are lost; spool: {self.spool.path}")

    def _host_metrics(self, step: int) -> dict[str, float]:
        """Host metrics due at ``step``, or ``{}``; the first failure turns sampling off (it is
        optional)."""
        try:
            metrics = self._host.sample_at(step)
        except Exception as e:  # noqa: BLE001 - sampling is optional
            self._warn_once("psutil", f"host sampling off ({e})")
            self.sample_host = False
            return {}
        return metrics or {}

    def _pack(self, items: list, final: bool = False) -> None:
        """Pack ``items`` (and a host sample, when one is due) into batches to send or spool."""
        final = final and not self._final_made
        if not items and self._dropped == self._dropped_reported and not final:
            return
        self._last_step = max([self._last_step] + [step for step, _, _ in items])
        host = self._host_metrics(self._last_step) if self.sample_host else {}
        if host:
            items = items + [(self._last_step, time.time_ns(), host)]
        dropped = self._dropped
        batches = self._packer.pack(items, dropped=dropped - self._dropped_reported, final=final)
        self._dropped_reported = dropped
        self._final_made = self._final_made or final
        for b in batches:
            self.stats["batches"] += 1
            self.stats["points"] += len(b.values) // 8
            if self._spooling:
                self._spool_batch(b)
            else:
                self._unacked.append(b)

    def _say(self, message: str) -> None:
        log.warning("probe monitor agent: rank %d: %s", self.rank, message)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self._say(message)

    def _connect(self) -> bool:
        reply = self._link.register()
        if reply is None:
            return False
        self._packer.max_points = min(self._packer.max_points,
                                      reply.max_batch_points or MAX_BATCH_POINTS)
        self.stats["reconnects"] += 1
        self._commands.start()
        return True

    def _to_spool(self) -> None:
        """Move every in-memory unacknowledged batch to the spool file, in order."""
        while self._unacked:
            self._spool_batch(self._unacked.popleft())
            self._spooling = True

    def _spool_batch(self, batch: Any) -> None:
        """Write one batch to the spool; when the spool is full or the disk refuses, drop it
        and count its points (the count reaches the service with a later batch)."""
        try:
            ok = self.spool.append(batch.SerializeToString())
        except OSError as e:
            ok = False
            self._warn_once("spool-io", f"cannot write the spool {self.spool.path} ({e.strerror})")
        if ok:
            self.stats["spooled_batches"] += 1
            return
        self._warn_once("spool-full", f"spool {self.spool.path} is full "
                                      f"({self.spool.max_bytes >> 20} MiB); dropping points "
                                      "until the service is back (they are counted)")
        self._dropped += len(batch.values) // 8
        self._dropped_reported -= batch.dropped      # its drop count must travel again

    def _stamp(self, batch: Any) -> Any:
        """Say in ``batch`` where the rank is now: its step and the collective it is in."""
        if self.collectives is not None:
            pending, entered = self.collectives.snapshot()
            batch.reports_collectives, batch.step_in = True, self.step_in
            batch.ClearField("pending")
            if pending is not None:
                op, seq, group, nbytes, size, peer, waiting = pending
                batch.pending.op, batch.pending.seq, batch.pending.group = op, seq, group
                batch.pending.bytes, batch.pending.group_size = nbytes, size
                batch.pending.peer, batch.pending.waiting_s = peer, waiting
            batch.entered.clear()
            batch.entered.update(entered)
        return batch

    def _push(self, batch: Any) -> bool:
        import grpc

        self._stamp(batch)
        try:
            ack = self._link.stub.Push(batch, timeout=self.push_timeout_s,
                                       metadata=self._link.metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                self.stats["rejected_batches"] += 1
                self._warn_once("rejected", f"the monitor rejected a batch: {e.details()}")
                return True
            self._link.lost(e)
            return False
        self._last_push = time.monotonic()
        if ack.duplicate:
            self.stats["duplicates"] += 1
        self.stats["acked_batches"] += 1
        self.stats["acked_points"] += len(batch.values) // 8
        return True

    def _send(self) -> None:
        from probe.monitor.proto import monitor_pb2 as pb

        if not self._link.connected and not self._connect():
            return
        if self._spooling:
            self._replay_spool()
            if self._spooling:
                return
        while self._unacked:
            if not self._push(self._unacked[0]):
                return
            self._unacked.popleft()
        if self._link.connected and time.monotonic() - self._last_push > 1.0:
            self._push(pb.MetricBatch(job=self.job, rank=self.rank, agent_id=self.agent_id,
                                      seq=0))
        if self._link.connected and self._uploads:
            self._send_uploads()
        if self._link.connected and self._dump_reports:
            self._send_dump_reports()

    def _replay_spool(self) -> None:
        """Resend the spool in order; delete it once every record is acknowledged."""
        from probe.monitor.proto import monitor_pb2 as pb

        self._to_spool()
        for i, payload in enumerate(self.spool.read()):
            if i < self._replayed:
                continue
            batch = pb.MetricBatch.FromString(payload)
            if not self._push(batch):
                return
            self._replayed += 1
            self.stats["resent_batches"] += 1
            if batch.agent_id != self.agent_id:      # a previous run's leftovers
                self.stats["acked_points"] -= len(batch.values) // 8
        self.spool.remove()
        self._spooling = False
        self._replayed = 0
