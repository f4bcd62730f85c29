"""How other packages plug into the bundled engine's training loop.

A run is described by a picklable :class:`~engine_adapter.bundled.spec.RunSpec`; each rank
builds its callbacks from :class:`PluginSpec` entries (``"package.module:factory"`` plus
keyword arguments), so the dump, the profiler and the monitor agent attach the same way in one
process or in N spawned ranks.

>>> class Printer(TrainCallback):
...     def on_step_end(self, ctx, step, metrics):
...         print(step, sorted(metrics))
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from collectors.store import StoreWriter


@dataclass
class TrainContext:
    """What a callback can see of the running rank."""

    rank: int
    world_size: int
    run: str                       # run name (the --out directory's name)
    out_dir: str                   # the run directory (store lives in out_dir/store)
    engine: str                    # "reference" | "fused"
    preset: str
    device: "torch.device"
    model: "torch.nn.Module"
    optimizer: "torch.optim.Optimizer"
    config: Any                    # engine_adapter.bundled.config.ModelConfig
    max_steps: int
    store: "StoreWriter"           # this rank's store writer (metrics, events, tensors)
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
class PluginSpec:
    """A picklable recipe for a callback: ``factory(**kwargs)`` must return a TrainCallback."""

    target: str                   # "package.module:factory"
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> TrainCallback:
        module_name, _, attr = self.target.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        return factory(**self.kwargs)
