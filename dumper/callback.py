"""The dump as a training callback of the bundled engine: ``CallbackSpec(DumpCallback, {...})``.

Each rank builds its own :class:`DumpCallback`, hooks its model, records the selected steps and
writes ``OUT/step{N}/rank{R}/`` plus TENSOR and NODE records through the rank's store writer
(``ctx.store``); no rank waits on another.
"""

from __future__ import annotations

import logging
from typing import Any

from probe.engine_adapter.callbacks import TrainCallback, TrainContext

log = logging.getLogger(__name__)


class DumpCallback(TrainCallback):
    """Dump the bundled engine's steps; keyword arguments as :class:`probe.dumper.session.DumpSession`."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.session: Any = None

    def on_train_start(self, ctx: TrainContext) -> None:
        from probe.dumper.session import DumpSession

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
        if self.session is None:
            return
        from probe.ground.files import DiskFull

        try:
            self.session.stop()
        except DiskFull as e:          # the training went on; the command ends with this line
            _DISK_FULL.append(e)       # (a spawned rank's: the rank ends with it, exit 2)


#: full disks the dumps of this process met (the command line ends with the first)
_DISK_FULL: list = []


def take_disk_full() -> Any:
    """The full disk (a :class:`probe.ground.files.DiskFull`) that stopped a dump of the bundled
    engine in this process since the last call, or None."""
    found = _DISK_FULL[0] if _DISK_FULL else None
    _DISK_FULL.clear()
    return found
