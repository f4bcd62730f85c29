"""A script's training steps, seen from its optimizer, as calls of the training callbacks.

A script run by ``probe profile -- SCRIPT`` has its own training loop, which calls none of our
callbacks. :class:`StepSource` stands in for that loop: the engine adapter's
:meth:`~engine_adapter.base.EngineAdapter.watch_steps` (the one optimizer-step detection, for
PyTorch and MindSpore alike) tells it when a step ends, and it calls a list of
:class:`~engine_adapter.callbacks.TrainCallback` objects as the bundled engine's loop does:

1. :meth:`StepSource.start`: ``on_train_start(ctx)`` with a :class:`TrainContext` of
   ``engine="script"`` (no model, optimizer or device: the script owns them; the rank and
   world size are the adapter's), then ``on_step_start(ctx, 0)``;
2. after each optimizer step: ``on_step_end(ctx, step, metrics)`` with ``step_time_ms``, the
   time since the previous optimizer step (the first: since start), then
   ``on_step_start(ctx, step + 1)``; each step's metrics, with what the callbacks added, are
   kept in :attr:`StepSource.steps`;
3. :meth:`StepSource.stop`: the adapter is detached (the source owns it), then
   ``on_train_end(ctx, error)``.

A callback that raises is reported once and disabled (:class:`CallbackList`); the script goes on.

>>> import tempfile, torch
>>> from engine_adapter.base import get_adapter
>>> class Show(TrainCallback):
...     def on_step_end(self, ctx, step, metrics):
...         print(ctx.engine, step, sorted(metrics))
>>> model = torch.nn.Linear(4, 2)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with StepSource(get_adapter("torch"), [Show()], tempfile.mkdtemp()) as source:
...     for _ in range(2):
...         model(torch.randn(3, 4)).sum().backward()
...         opt.step()
script 0 ['step_time_ms']
script 1 ['step_time_ms']
>>> [s["step"] for s in source.steps]
[0, 1]
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from engine_adapter.base import EngineAdapter
from engine_adapter.callbacks import CallbackList, TrainCallback, TrainContext


class StepSource:
    """Drives ``callbacks`` from ``adapter``'s optimizer steps; see the module docstring.

    ``out_dir``: the run directory callbacks write under; ``run``: the run's name (default:
    the directory's name); ``store``: the rank's store writer callbacks may write to (its owner
    closes it).
    """

    def __init__(self, adapter: EngineAdapter, callbacks: Sequence[TrainCallback], out_dir: str,
                 *, run: str | None = None, store: Any = None) -> None:
        self.adapter = adapter
        self.out_dir = out_dir
        self.run = run or os.path.basename(os.path.abspath(out_dir))
        self.store = store
        self.step = 0
        self.steps: list[dict[str, float]] = []
        self.ctx: TrainContext | None = None
        self._callbacks = list(callbacks)
        self._runner: CallbackList | None = None
        self._last_ns = 0

    def start(self) -> "StepSource":
        """Call ``on_train_start`` and ``on_step_start(0)``, then follow the optimizer."""
        if self.ctx is not None:
            return self
        rank = self.adapter.rank()
        self.ctx = TrainContext(rank=rank, world_size=self.adapter.world_size(), run=self.run,
                                out_dir=self.out_dir, engine="script", preset="", device=None,
                                model=None, optimizer=None, config=None, max_steps=None,
                                store=self.store, extra={"step_source": "optimizer"})
        self._runner = CallbackList(self._callbacks, rank)
        self._runner.call("on_train_start", self.ctx)
        self._runner.call("on_step_start", self.ctx, self.step)
        self._last_ns = time.perf_counter_ns()
        self.adapter.watch_steps(self._on_step)
        return self

    def _on_step(self) -> None:
        now = time.perf_counter_ns()
        step = self.step
        metrics: dict[str, float] = {"step_time_ms": (now - self._last_ns) / 1e6}
        self._last_ns = now
        self._runner.call("on_step_end", self.ctx, step, metrics)
        self.steps.append({"step": step, **metrics})
        self.step = step + 1
        self._runner.call("on_step_start", self.ctx, self.step)

    def stop(self, error: BaseException | None = None) -> None:
        """Stop following the optimizer (detach the adapter) and call ``on_train_end``.

        Safe to call twice.
        """
        if self.ctx is None or self._runner is None:
            return
        runner, self._runner = self._runner, None
        self.adapter.detach()
        runner.call("on_train_end", self.ctx, error)

    def __enter__(self) -> "StepSource":
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc)
