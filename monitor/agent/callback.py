"""The monitor agent as a training callback: what each rank of a monitored run runs.

The bundled engine adds :class:`MonitorAgentCallback` when ``PROBE_MONITOR=host:port`` is set; any
training loop that drives :class:`~probe.engine_adapter.callbacks.TrainCallback` objects can add it.
It records each step's metrics through a :class:`~probe.monitor.agent.monitor_agent.MonitorAgent`
and runs the service's ``trace`` commands as profiler sessions on the training thread. Under
``torch.distributed`` it also tells the agent which collective the rank is in
(:class:`probe.engine_adapter.torch_comm.CollectiveTracker`), so that the service can diagnose a
hang, and where a ``dump_stacks`` command writes: ``<run folder>/stacks/``. A ``dump`` command (a
targeted dump, :mod:`probe.monitor.targeted_dump`) is carried out by the callback's own runner
(:class:`~probe.monitor.agent.dump_runner.TargetedDumps`), which opens a dump session of the run's
model for the asked steps: adding this one callback is all a loop needs to take dump orders.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from probe.engine_adapter.callbacks import TrainCallback, TrainContext
from probe.monitor.address import ADDR_ENV, monitor_address
from probe.monitor.agent.dump_runner import TargetedDumps
from probe.monitor.agent.monitor_agent import JOB_ENV, MonitorAgent
from probe.monitor.targeted_dump import DumpOrder

log = logging.getLogger(__name__)


class MonitorAgentCallback(TrainCallback):
    """The monitor agent as a training callback (the bundled engine adds it with PROBE_MONITOR).

    ``addr`` defaults to env ``PROBE_MONITOR`` (``host:port``), ``job`` to env
    ``PROBE_MONITOR_JOB`` or the run name. Each step's metrics dict (loss, step_time_ms,
    tokens_per_s, grad_norm, data_time_ms, comm_time_ms, compute_time_ms, compute_cpu_ms on a
    CPU rank, nonfinite_grads, and flops/mfu/hfu when the profiler added them) is recorded,
    plus device memory on CUDA.
    A ``trace`` command starts a profiler session (:mod:`probe.profiler.session`) at the first asked
    step and stops it after the last one; the trace files go to the service.

    >>> from probe.engine_adapter.callbacks import CallbackSpec
    >>> CallbackSpec(MonitorAgentCallback, {"addr": "127.0.0.1:50051"}).build().addr
    '127.0.0.1:50051'
    """

    def __init__(self, addr: str | None = None, job: str | None = None, token: str | None = None,
                 spool_path: str | None = None, trace_dir: str | None = None,
                 **agent_options: Any) -> None:
        self.addr = addr or monitor_address()
        self.job = job or os.environ.get(JOB_ENV)
        self.token = token
        self.spool_path = spool_path
        self.trace_dir = trace_dir
        self.agent_options = agent_options
        self.agent: MonitorAgent | None = None
        self._current = -1
        self._lock = threading.Lock()
        self._pending: list[tuple[str, int, int]] = []
        self._active: tuple[str, int, int, Any, str] | None = None
        self._stop_requested = False
        self._uploads_at_start = 0
        self._cuda = None
        self._tracker: Any = None
        self.dumps: TargetedDumps | None = None

    def on_train_start(self, ctx: TrainContext) -> None:
        if not self.addr:
            log.warning("probe monitor agent: no monitor address: set %s=host:port; monitoring is off",
                        ADDR_ENV)
            return
        self.job = self.job or ctx.run
        if self.trace_dir is None:
            self.trace_dir = os.path.join(ctx.out_dir, "monitor-traces", f"rank{ctx.rank}")
        self.agent = MonitorAgent(self.addr, self.job, ctx.rank, ctx.world_size, ctx.engine,
                                  token=self.token, spool_path=self.spool_path,
                                  on_command=self._on_command, **self.agent_options).start()
        self.agent.stacks_dir = os.path.join(ctx.out_dir, "stacks")
        ctx.extra["monitor_agent"] = self.agent     # other callbacks send through it (numerics)
        self.dumps = TargetedDumps(report=self._report_dump)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            from probe.engine_adapter import torch_comm

            self._tracker = torch_comm.add_listener(torch_comm.CollectiveTracker())
            self.agent.collectives = self._tracker
        if getattr(ctx.device, "type", "cpu") == "cuda":
            import torch
            self._cuda = torch.cuda

    def _report_dump(self, order: DumpOrder, path: str, steps: list[int], files: int,
                     nbytes: int, error: str) -> None:
        self.agent.report_dump(order.dump_id, order.start, order.end, path, steps, files, nbytes,
                               error)

    def _on_command(self, cmd: Any) -> None:
        if cmd.kind == "trace":
            with self._lock:
                if cmd.start_step >= 0:
                    start, end = cmd.start_step, cmd.end_step
                else:
                    start = self._current + 1
                    end = start + max(1, cmd.next_steps) - 1
                self._pending.append((cmd.id, start, end))
        elif cmd.kind == "stop_trace":
            with self._lock:
                self._pending = [p for p in self._pending if cmd.trace_id not in ("", p[0])]
            active = self._active
            if active is not None and cmd.trace_id in ("", active[0]):
                self._stop_requested = True
        elif cmd.kind == "dump" and self.dumps is not None:
            self.dumps.schedule.add(DumpOrder.from_command(cmd), self._current)
        elif cmd.kind == "set_interval" and self.agent is not None and cmd.interval_s > 0:
            self.agent.flush_interval_s = cmd.interval_s

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        self._current = step
        if self.agent is not None:
            self.agent.step_in = step
            self._uploads_at_start = self.agent.stats["uploads"]
        if self.dumps is not None:
            self.dumps.step_start(ctx.model, ctx.out_dir, ctx.rank, ctx.run, step)
        if not self._pending or self._active is not None:
            return
        with self._lock:
            due = [p for p in self._pending if p[1] <= step]
            for p in due:
                self._pending.remove(p)
        for trace_id, start, end in due:
            if start < step or self._active is not None:
                why = (f"steps {start}-{end} had already started (rank {ctx.rank} was at step "
                       f"{step})" if start < step else "another trace was running")
                self.agent.upload_trace(trace_id, start, end, error=why)
                continue
            self._start_trace(ctx, trace_id, start, end)

    def _start_trace(self, ctx: TrainContext, trace_id: str, start: int, end: int) -> None:
        out = os.path.join(self.trace_dir, trace_id)
        try:
            from probe.profiler.session import Session

            session = Session(out, rank=ctx.rank, world_size=ctx.world_size, run=ctx.run,
                              steps=range(start, end + 1), first_step=start).start()
        except Exception as e:  # noqa: BLE001 - no trace, say why, keep training
            self.agent.upload_trace(trace_id, start, end,
                                    error=f"cannot start a profiler session: {type(e).__name__}: {e}")
            return
        self._active = (trace_id, start, end, session, out)

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        if self.agent is None:
            return
        metrics = self.dumps.step_end(step, metrics)
        if self._cuda is not None:
            metrics = dict(metrics, device_mem_mb=self._cuda.memory_allocated(ctx.device) / 2**20,
                           device_max_mem_mb=self._cuda.max_memory_allocated(ctx.device) / 2**20)
        # the deep trace's own cost is in this step's times: profiling, or sending its files
        # on the sender thread (which shares the interpreter and the CPU with training)
        if (self._active is not None or self.agent.uploading
                or self.agent.stats["uploads"] != self._uploads_at_start):
            metrics = dict(metrics, traced=1.0)
        self.agent.record(step, metrics)
        if self._active is not None:
            if step >= self._active[2]:
                self._stop_trace()
            elif self._stop_requested:
                self._stop_trace(last=step)
            else:
                self._active[3].step()

    def _stop_trace(self, error: str = "", last: int | None = None) -> None:
        trace_id, start, end, session, out = self._active
        self._active = None
        self._stop_requested = False
        end = end if last is None else last
        try:
            session.stop()
            files = sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*")
                           if p.is_file())
        except Exception as e:  # noqa: BLE001
            self.agent.upload_trace(trace_id, start, end,
                                    error=f"profiler session failed: {type(e).__name__}: {e}")
            return
        if not files and not error:
            error = f"the profiler session wrote no files under {out}"
        self.agent.upload_trace(trace_id, start, end, files, error=error, root=out)

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        if self._tracker is not None:
            from probe.engine_adapter import torch_comm

            torch_comm.remove_listener(self._tracker)
            self._tracker = None
        if self.agent is None:
            return
        if self._active is not None:
            self._stop_trace(error=f"training ended at step {self._current} before step "
                                   f"{self._active[2]}", last=self._current)
        with self._lock:
            pending, self._pending = self._pending, []
        for trace_id, start, end in pending:
            self.agent.upload_trace(trace_id, start, end,
                                    error=f"training ended at step {self._current} before step {start}")
        self.dumps.train_end(self._current)
        self.agent.close()
