"""The flight recorder: an always-on ring of the last K steps, written as a dump when something goes wrong.

``probe.flight_recorder(model, steps=K, out=...)`` (a context manager; steps from the optimizer),
``--flight-recorder K`` on ``probe train``, ``probe dump`` and ``probe profile``
(:class:`FlightCallback` on every rank of the bundled engine). Each rank keeps its last K steps'
per-module statistics in a :class:`~probe.dumper.flight_ring.FlightRing` and writes them
(:mod:`probe.dumper.flight_write`) when a trigger fires (:mod:`probe.dumper.flight_triggers`):
a non-finite loss or gradient norm, a loss or gradient-norm spike, an exception in the step,
``SIGUSR1`` (``kill -USR1 <pid>``: written at the end of the step in flight). Training then goes
on, or stops with ``stop=True`` (``--flight-recorder-stop``). ``probe origin OUT`` names where the
trouble began.

Example::

    import probe
    with probe.flight_recorder(model, steps=8, out="runs/fr") as fr:
        for batch in data:
            loss = model(batch).sum()
            fr.observe(loss)            # optional: the loss's NaN or spike triggers too
            loss.backward()
            optimizer.step()            # ends a step
            optimizer.zero_grad()
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from typing import Any

from probe.dumper.flight_ring import FlightRing
from probe.dumper.flight_triggers import Trigger, Triggers
from probe.engine_adapter.callbacks import TrainCallback, TrainContext

log = logging.getLogger(__name__)


class FlightRecorderStop(RuntimeError):
    """Raised from the optimizer step of a script whose recorder was told to stop on a trigger."""


class FlightRecorder:
    """One rank's flight recorder; see the module docstring."""

    def __init__(self, model: Any = None, *, steps: int = 8, out: str = "flight", level: str = "module",
                 stop: bool = False, framework: str = "torch", auto_step: bool = True,
                 store: Any = None, rank: int | None = None, world_size: int | None = None,
                 run: str | None = None, first_step: int | None = 0, signals: bool = True) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            from probe.ground.errors import ProbeError
            raise ProbeError(f"flight recorder steps {steps!r}: give a whole number of at least 1")
        self.model = model
        self.k = steps
        self.out = str(out)
        self.level = level
        self.stop_on_trigger = stop
        self.framework = framework
        self.auto_step = auto_step
        self.store = store
        self._own_store = False
        self._rank_arg, self._world_arg = rank, world_size
        self.run = run or os.path.basename(os.path.abspath(self.out))
        self.first_step = first_step
        self.signals = signals
        self.ring: FlightRing | None = None
        self.triggers = Triggers(steps)
        self.fired: list[Trigger] = []
        self._loss: float | None = None
        self._previous_handler: Any = None
        self._stopped = False

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> "FlightRecorder":
        from probe.engine_adapter.base import get_adapter

        if self.ring is not None:
            return self
        adapter = get_adapter(self.framework)
        self.rank = adapter.rank() if self._rank_arg is None else int(self._rank_arg)
        self.world_size = adapter.world_size() if self._world_arg is None else int(self._world_arg)
        self.ring = FlightRing(adapter, self.k, self.level)
        self.ring.attach(self.model)
        if self.auto_step:
            adapter.watch_steps(self._optimizer_step)
        if self.signals and threading.current_thread() is threading.main_thread():
            try:
                self._previous_handler = signal.signal(signal.SIGUSR1, self._on_signal)
            except (ValueError, OSError, AttributeError):     # no SIGUSR1 here
                self._previous_handler = None
        if self.first_step is not None:
            self.ring.begin_step(self.first_step)
        return self

    def __enter__(self) -> "FlightRecorder":
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc if isinstance(exc, Exception) and not isinstance(exc, FlightRecorderStop) else None)

    def stop(self, error: BaseException | None = None) -> None:
        """Detach; with ``error`` (the step raised) the ring, step in flight included, is written."""
        if self._stopped or self.ring is None:
            return
        self._stopped = True
        ring = self.ring
        try:
            if error is not None:
                ring.close_partial()
                self.fire(Trigger("exception", ring.step,
                                  f"step {ring.step}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"))
            ring.detach()
        finally:
            if self._previous_handler is not None:
                try:
                    signal.signal(signal.SIGUSR1, self._previous_handler)
                except (ValueError, OSError):
                    pass
            if self._own_store and self.store is not None:
                try:
                    self.store.close()
                except Exception:  # noqa: BLE001
                    pass

    # ----------------------------------------------------------------- steps
    def begin_step(self, step: int) -> None:
        if self.ring is not None and not self._stopped:
            self.ring.begin_step(step)

    def observe(self, loss: Any) -> None:
        """The step's loss (a tensor or a number), for the triggers; read at the step's end."""
        self._loss = loss

    def end_step(self, *, loss: float | None = None, grad_norm: float | None = None,
                 losses: list[float] | None = None) -> Trigger | None:
        """Close the step and check the triggers (the ring's own gradient norm when none is
        given); a trigger writes the ring. Returns the trigger, if any."""
        ring = self.ring
        if ring is None or self._stopped or not ring.active:
            return None
        ring.end_step()
        try:
            if loss is None and self._loss is not None:
                loss = _number(self._loss)
            self._loss = None
            if grad_norm is None:
                grad_norm = ring.grad_norm()
                if math.isnan(grad_norm) and ring.nonfinite() == 0:
                    grad_norm = None          # no parameter gradient recorded this step
            if losses is None and loss is not None:
                losses = [loss]
            trigger = self.triggers.check(ring.step, losses, grad_norm)
        except Exception as e:  # noqa: BLE001 - never break training
            ring.report_error("checking the triggers", e)
            return None
        if trigger is not None:
            self.fire(trigger)
        return trigger

    def step(self, loss: Any = None) -> None:
        """End the current step (``loss``: its loss, for the triggers) and begin the next."""
        ring = self.ring
        if ring is None:
            return
        current = ring.step
        trigger = self.end_step(loss=_number(loss) if loss is not None else None)
        if not self._stopped:
            ring.begin_step(current + 1)
        if trigger is not None and self.stop_on_trigger:
            raise FlightRecorderStop(f"probe flight recorder: {trigger.reason}; stopped as asked "
                                     f"(ring written to {self.out})")

    def _optimizer_step(self) -> None:
        self.step()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.triggers.signalled = True
        previous = self._previous_handler
        if callable(previous) and previous not in (signal.SIG_IGN, signal.SIG_DFL):
            previous(signum, frame)

    # ----------------------------------------------------------------- writing
    def fire(self, trigger: Trigger) -> None:
        """Write the ring, marked with ``trigger`` (never raises)."""
        from probe.dumper.flight_write import write_ring

        ring = self.ring
        try:
            if self.store is None:
                from probe.collectors.store import StoreWriter
                self.store = StoreWriter(self.out, rank=self.rank, run=self.run)
                self._own_store = True
            with ring.adapter.suspended():
                steps = write_ring(ring, self.out, rank=self.rank, run=self.run, trigger=trigger.kind,
                                   reason=trigger.reason, store=self.store, world_size=self.world_size,
                                   framework=ring.adapter.framework)
            self.fired.append(trigger)
            if self.rank == 0 or trigger.kind in ("signal", "exception"):
                span = f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}" if steps else "no step"
                log.warning(f"probe flight recorder: rank {self.rank}: {trigger.reason}: ring of "
                            f"{span} written to {self.out} (probe origin {self.out})")
        except Exception as e:  # noqa: BLE001
            ring.report_error("writing the ring", e)


def _number(x: Any) -> float | None:
    try:
        return float(x.detach().float().item()) if hasattr(x, "detach") else float(x)
    except Exception:  # noqa: BLE001
        return None


def flight_recorder(model: Any = None, *, steps: int = 8, out: str = "flight", **kwargs: Any) -> FlightRecorder:
    """A flight recorder as a context manager (``with probe.flight_recorder(model, steps=8): ...``)."""
    return FlightRecorder(model, steps=steps, out=out, **kwargs)


class FlightCallback(TrainCallback):
    """The flight recorder on a rank of the bundled engine: ``CallbackSpec(FlightCallback,
    {"steps": K, "level": "module", "stop": False})``. Its triggers read every rank's loss and
    the all-reduced gradient norm, so every rank writes its ring at the same step; with ``stop``
    the loop ends after that step (``ctx.extra["stop"]``)."""

    def __init__(self, steps: int = 8, level: str = "module", stop: bool = False) -> None:
        self.steps, self.level, self.stop = steps, level, stop
        self.recorder: FlightRecorder | None = None

    def on_train_start(self, ctx: TrainContext) -> None:
        self.recorder = FlightRecorder(ctx.model, steps=self.steps, out=ctx.out_dir, level=self.level,
                                       auto_step=False, store=ctx.store, rank=ctx.rank,
                                       world_size=ctx.world_size, run=ctx.run, first_step=None)
        self.recorder.start()

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        self.recorder.begin_step(step)

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        losses = ctx.extra.get("rank_losses")
        trigger = self.recorder.end_step(loss=metrics.get("loss"), grad_norm=metrics.get("grad_norm"),
                                         losses=list(losses) if losses else None)
        if trigger is not None and self.stop:
            ctx.extra["stop"] = f"flight recorder: {trigger.reason}"

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        if self.recorder is not None:
            self.recorder.stop(error if isinstance(error, Exception) else None)
