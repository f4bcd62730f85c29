"""The training-callback interface: how the dump, the profiler and the monitor agent follow steps.

A training loop (the bundled engine's, or :class:`probe.engine_adapter.steps.StepSource` over any
script's optimizer) calls a list of :class:`TrainCallback` objects at fixed points of each
rank's run. A run that spawns ranks describes each callback by a picklable
:class:`CallbackSpec`: the callback's class (or any factory) itself, not its name in a string,
so a reader (and a tool) follows it to its definition, and each rank builds its own.

>>> class Printer(TrainCallback):
...     def on_step_end(self, ctx, step, metrics):
...         print(step, sorted(metrics))
>>> runner = CallbackList([CallbackSpec(Printer).build()], rank=0)
>>> runner.call("on_step_end", None, 3, {"loss": 1.0})
3 ['loss']
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from probe.collectors.store import StoreWriter


@dataclass
class TrainContext:
    """What a callback can see of the running rank."""

    rank: int
    world_size: int
    run: str                       # run name (the --out directory's name)
    out_dir: str                   # the run directory (store lives in out_dir/store)
    engine: str                    # "reference" | "fused" (bundled engine), "script"
    preset: str
    device: "torch.device | None"
    model: "torch.nn.Module | None"
    optimizer: "torch.optim.Optimizer | None"
    config: Any                    # engine.config.ModelConfig for the bundled engine, else None
    max_steps: int | None
    store: "StoreWriter | None"    # this rank's store writer (metrics, events, tensors)
    extra: dict[str, Any] = field(default_factory=dict)


class TrainCallback:
    """Hooks called by the training loop of each rank, in this order.

    ``on_train_start`` once (model and optimizer built, weights loaded); per step
    ``on_step_start`` then ``on_step_end`` with the step's metrics (``loss``, ``step_time_ms``,
    ``tokens_per_s``, ``grad_norm``, ``lr``, ...; callbacks may add keys that later callbacks
    see); ``on_train_end`` once, also after an exception in the loop (``error`` is set then).
    A callback that raises is reported once and disabled; it never stops training.
    """

    def on_train_start(self, ctx: TrainContext) -> None:
        pass

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        pass

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        pass

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        pass


@dataclass(frozen=True)
class CallbackSpec:
    """A picklable recipe for a callback: ``factory(**kwargs)`` returns a :class:`TrainCallback`.

    ``factory`` is the class (or a module-level function) itself; pickling stores its module and
    name, so a spawned rank imports the same definition.
    """

    factory: Callable[..., TrainCallback]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> TrainCallback:
        return self.factory(**self.kwargs)


class CallbackList:
    """Calls every callback in order; one that raises is reported once and disabled."""

    def __init__(self, callbacks: list[TrainCallback], rank: int) -> None:
        self.callbacks = list(callbacks)
        self.rank = rank

    def call(self, method: str, *args: Any) -> None:
        for cb in list(self.callbacks):
            try:
                getattr(cb, method)(*args)
            except Exception as e:  # noqa: BLE001 - a callback must never stop training
                self.callbacks.remove(cb)
                log.warning(f"probe: rank {self.rank}: {type(cb).__name__}.{method} failed "
                            f"({type(e).__name__}: {e}); it is disabled for the rest of the run")
