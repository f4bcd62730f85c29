"""The rank's runner of targeted dumps: a :class:`~probe.dumper.session.DumpSession` opened by
the monitor agent itself when the service asks (:mod:`probe.monitor.targeted_dump`).

:class:`~probe.monitor.agent.callback.MonitorAgentCallback` owns one :class:`TargetedDumps` and
drives it from its own step callbacks, so a run that adds only the monitor agent (the bundled
engine under ``PROBE_MONITOR``, or a script's own loop) accepts dump orders; there is no second
callback to add and no order between callbacks to keep. It costs nothing while no dump is
asked for (no hook is on). One dump runs at a time; an order whose steps have already begun, or
that comes while another runs, is answered with why it was not dumped. The steps it dumps carry
``traced = 1`` in their metrics, so the monitor's timing detectors leave them out.

>>> runner = TargetedDumps(report=lambda order, **outcome: print(order.dump_id, outcome["error"]))
>>> runner.schedule.add(DumpOrder("d1", 3, 3), current=0)
DumpOrder(dump_id='d1', start=3, end=3, next_steps=0, scope='', task='statistics', level='module')
>>> runner.step_start(model=None, out_dir="runs/x", rank=0, run="x", step=3)
d1 this rank gave the monitor agent no model to dump
"""

from __future__ import annotations

import os
from typing import Any, Callable

from probe.monitor.targeted_dump import DumpOrder, DumpSchedule, dump_folder, folder_size

#: ``report(order, path=, steps=, files=, nbytes=, error=)``: how an order went, to the service.
Report = Callable[..., None]


class TargetedDumps:
    """Carries out a rank's dump orders on the training thread: ``schedule.add`` (command
    thread) files an order; ``step_start``/``step_end``/``train_end`` (training thread) start a
    dump session at an order's first step, end it after its last, and ``report`` the folder
    ``<run folder>/monitor_dumps/<id>/`` (or why there is none)."""

    def __init__(self, report: Report) -> None:
        self.schedule = DumpSchedule()
        self.report = report
        self.active: tuple[DumpOrder, Any, str] | None = None    # (order, session, folder)

    def _done(self, order: DumpOrder, path: str = "", steps: list[int] | None = None,
              files: int = 0, nbytes: int = 0, error: str = "") -> None:
        self.report(order, path=path, steps=list(steps or []), files=files, nbytes=nbytes,
                    error=error)

    def step_start(self, model: Any, out_dir: str, rank: int, run: str, step: int) -> None:
        """Start the orders whose first step is ``step``; answer the ones that cannot start."""
        if not len(self.schedule):
            return
        for order in self.schedule.due(step):
            if model is None:
                self._done(order, error="this rank gave the monitor agent no model to dump")
            elif order.start < step:
                self._done(order, error=f"steps {order.start}-{order.end} had already started "
                                        f"(rank {rank} was at step {step})")
            elif self.active is not None:
                self._done(order, error=f"another dump ({self.active[0].dump_id}) was running")
            else:
                self._start(model, out_dir, rank, run, order, step)

    def _start(self, model: Any, out_dir: str, rank: int, run: str, order: DumpOrder,
               step: int) -> None:
        from probe.dumper.session import DumpSession

        folder = dump_folder(out_dir, order.dump_id)
        try:
            session = DumpSession(model, out=folder, level=order.level, task=order.task,
                                  steps=range(order.start, order.end + 1),
                                  scope=order.scope or None, auto_step=False, store=False,
                                  rank=rank, run=run, first_step=None, quiet=True,
                                  fsync="never")
            session.start()
            session.begin_step(step)
        except Exception as e:  # noqa: BLE001 - no dump, say why, keep training
            self._done(order, error=f"cannot start the dump: {type(e).__name__}: {e}")
            return
        self.active = (order, session, folder)

    def step_end(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """End the dump's step ``step`` (the last one: finish and report); the metrics, marked
        ``traced`` while a dump runs."""
        if self.active is None:
            return metrics
        order, session, _ = self.active
        session.end_step()
        if step >= order.end:
            self._finish()
        else:
            session.begin_step(step + 1)
        return dict(metrics, traced=1.0)

    def _finish(self, error: str = "") -> None:
        order, session, folder = self.active
        self.active = None
        try:
            session.stop()
        except Exception as e:  # noqa: BLE001
            error = error or f"the dump failed: {type(e).__name__}: {e}"
        steps = list(session.steps_written)
        files, nbytes = folder_size(folder)
        if not steps and not error:
            error = (f"nothing matched: no entry of scope {order.scope!r} ran in steps "
                     f"{order.start}-{order.end}")
        self._done(order, os.path.abspath(folder), steps, files, nbytes, error)

    def train_end(self, last_step: int) -> None:
        """Finish the running dump and answer every order not started."""
        if self.active is not None:
            order, session, _ = self.active
            self._finish(error="" if session.steps_written else
                         f"training ended before step {order.start} was written")
        for order in self.schedule.drain():
            self._done(order, error=f"training ended at step {last_step} before step "
                                    f"{order.start}")
