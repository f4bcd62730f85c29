"""The dump as a training callback of the bundled engine: ``CallbackSpec(DumpCallback, {...})``.

Each rank builds its own :class:`DumpCallback`, hooks its model, records the selected steps and
writes ``OUT/step{N}/rank{R}/`` plus TENSOR and NODE records through the rank's store writer
(``ctx.store``); no rank waits on another.
"""

from __future__ import annotations

import os
from typing import Any

from probe.engine_adapter.callbacks import TrainCallback, TrainContext


class DumpCallback(TrainCallback):
    """Dump the bundled engine's steps; keyword arguments as :class:`probe.session.DumpSession`."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.session: Any = None

    def on_train_start(self, ctx: TrainContext) -> None:
        from probe.session import DumpSession

        options = dict(self.options)
        options.setdefault("out", ctx.out_dir)
        options.setdefault("run", ctx.run)
        self.session = DumpSession(ctx.model, auto_step=False, store=ctx.store, rank=ctx.rank,
                                   first_step=None, quiet=ctx.rank != 0, **options)
        self.session.start()
        ctx.extra["dump_notes"] = self.session.notes()

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        self.session.begin_step(step)

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        self.session.end_step()

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        if self.session is not None:
            self.session.stop()


class TargetedDumpCallback(TrainCallback):
    """The rank's runner of targeted dumps (:mod:`probe.monitor.targeted_dump`): off until the
    monitor service sends a ``dump`` command, then a :class:`probe.session.DumpSession` of the
    matching modules for exactly the asked steps, written to
    ``OUT/monitor_dumps/<id>/step{N}/rank{R}/``, and the folder reported to the service.

    It goes before the monitor agent's callback in the run (the bundled engine appends the
    agent's last), and costs nothing while no dump is asked for: no hook is on. One dump runs at
    a time; an order whose steps have already begun, or that comes while another runs, is
    answered with why it was not dumped. The steps it dumps carry ``traced = 1`` in their
    metrics, so the monitor's timing detectors leave them out.
    """

    def __init__(self) -> None:
        self.schedule: Any = None
        self.active: Any = None            # (order, session, folder)
        self._ctx: TrainContext | None = None

    def on_train_start(self, ctx: TrainContext) -> None:
        from probe.monitor.targeted_dump import SCHEDULE_KEY, DumpSchedule

        self._ctx = ctx
        self.schedule = ctx.extra.setdefault(SCHEDULE_KEY, DumpSchedule())
        self.schedule.runner = self

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        if self.schedule is None or not len(self.schedule):
            return
        for order in self.schedule.due(step):
            if order.start < step:
                self.schedule.done(order, error=f"steps {order.start}-{order.end} had already "
                                                f"started (rank {ctx.rank} was at step {step})")
            elif self.active is not None:
                self.schedule.done(order, error=f"another dump ({self.active[0].dump_id}) was "
                                                "running")
            else:
                self._start(ctx, order, step)

    def _start(self, ctx: TrainContext, order: Any, step: int) -> None:
        from probe.monitor.targeted_dump import dump_folder
        from probe.session import DumpSession

        folder = dump_folder(ctx.out_dir, order.dump_id)
        try:
            session = DumpSession(ctx.model, out=folder, level=order.level, task=order.task,
                                  steps=range(order.start, order.end + 1),
                                  scope=order.scope or None, auto_step=False, store=False,
                                  rank=ctx.rank, run=ctx.run, first_step=None, quiet=True,
                                  fsync="never")
            session.start()
            session.begin_step(step)
        except Exception as e:  # noqa: BLE001 - no dump, say why, keep training
            self.schedule.done(order, error=f"cannot start the dump: {type(e).__name__}: {e}")
            return
        self.active = (order, session, folder)

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        if self.active is None:
            return
        metrics["traced"] = 1.0
        order, session, _ = self.active
        session.end_step()
        if step >= order.end:
            self._finish()
        else:
            session.begin_step(step + 1)

    def _finish(self, error: str = "") -> None:
        from probe.monitor.targeted_dump import folder_size

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
        self.schedule.done(order, os.path.abspath(folder), steps, files, nbytes, error)

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        if self.active is not None:
            order, session, _ = self.active
            self._finish(error="" if session.steps_written else
                         f"training ended before step {order.start} was written")
        if self.schedule is not None:
            self.schedule.runner = None       # orders left: the agent answers them
