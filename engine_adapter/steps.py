"""A script's training steps, seen from its optimizer, as calls of the training callbacks.

A script run by ``probe profile -- SCRIPT`` has its own training loop, which calls none of our
callbacks. :class:`StepSource` stands in for that loop: the engine adapter's
:meth:`~probe.engine_adapter.base.EngineAdapter.watch_steps` (the one optimizer-step detection, for
PyTorch and MindSpore alike) tells it when a step ends, and it calls a list of
:class:`~probe.engine_adapter.callbacks.TrainCallback` objects as the bundled engine's loop does:

1. :meth:`StepSource.start`: ``on_train_start(ctx)`` with a :class:`TrainContext` of
   ``engine="script"`` (no model, optimizer or device: the script owns them; the rank and
   world size are the adapter's), then ``on_step_start(ctx, 0)``; with ``setup=True`` (a
   script run from its first line) step 0 starts only when the script constructs its first
   optimizer (:func:`watch_first_optimizer`): imports and model construction before it are the
   run's set-up, not step 0;
2. after each optimizer step: ``on_step_end(ctx, step, metrics)`` with ``step_time_ms``, the
   time since the previous optimizer step (the first: since start), then
   ``on_step_start(ctx, step + 1)``; each step's metrics, with what the callbacks added, are
   kept in :attr:`StepSource.steps`;
3. :meth:`StepSource.stop`: the adapter is detached (the source owns it), then
   ``on_train_end(ctx, error)``.

A callback that raises is reported once and disabled (:class:`CallbackList`); the script goes on.

>>> import tempfile, torch
>>> from probe.engine_adapter.base import get_adapter
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
from typing import Any, Callable, Sequence

from probe.engine_adapter.base import EngineAdapter
from probe.engine_adapter.callbacks import CallbackList, TrainCallback, TrainContext
from probe.ground.frameworks import framework as framework_spec


def watch_first_optimizer(framework: str, on_first: Callable[[], None]) -> Callable[[], None] | None:
    """Call ``on_first()`` once, right after the first optimizer is constructed; returns the
    function that stops watching (call it when done), or None where the framework offers no
    way to see it (MindSpore: the caller starts step 0 at once).

    PyTorch: every optimizer's constructor runs ``torch.optim.Optimizer.__init__``, which is
    wrapped until the first one has run.

    >>> import torch
    >>> seen = []
    >>> stop = watch_first_optimizer("torch", lambda: seen.append("first"))
    >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    >>> opt2 = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    >>> stop(); seen
    ['first']
    """
    if framework_spec(framework).name != "torch":
        return None
    import torch

    base = torch.optim.Optimizer
    original = base.__dict__["__init__"]
    fired = False

    def stop() -> None:
        if base.__dict__.get("__init__") is init:
            base.__init__ = original

    def init(self, *args: Any, **kwargs: Any) -> None:
        nonlocal fired
        original(self, *args, **kwargs)
        if not fired:
            fired = True
            stop()
            on_first()

    base.__init__ = init
    return stop


class StepSource:
    """Drives ``callbacks`` from ``adapter``'s optimizer steps; see the module docstring.

    ``out_dir``: the run directory callbacks write under; ``run``: the run's name (default:
    the directory's name); ``store``: the rank's store writer callbacks may write to (its owner
    closes it); ``setup``: step 0 starts at the first optimizer's construction (see the module
    docstring), not at :meth:`start`.
    """

    def __init__(self, adapter: EngineAdapter, callbacks: Sequence[TrainCallback], out_dir: str,
                 *, run: str | None = None, store: Any = None, setup: bool = False) -> None:
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
        self._setup = setup
        self._started = False               # on_step_start(0) called
        self._unwatch: Callable[[], None] | None = None

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
        if self._setup:
            self._unwatch = watch_first_optimizer(self.adapter.framework, self._first_step)
        if self._unwatch is None:
            self._first_step()
        self.adapter.watch_steps(self._on_step)
        return self

    def _first_step(self) -> None:
        """Step 0 starts (at :meth:`start`, or at the first optimizer's construction)."""
        if self._started or self._runner is None:
            return
        self._started = True
        self._runner.call("on_step_start", self.ctx, self.step)
        self._last_ns = time.perf_counter_ns()

    def _on_step(self) -> None:
        self._first_step()           # an optimizer made before start(): step 0 starts here
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
        if self._unwatch is not None:
            self._unwatch()
        self.adapter.detach()
        runner.call("on_train_end", self.ctx, error)

    def __enter__(self) -> "StepSource":
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc)
