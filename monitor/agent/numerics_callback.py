"""Per-module numerics every step, as a training callback: norms, update ratios, NaN/Inf counts.

:class:`NumericsCallback` watches the modules of a model (every leaf module with parameters, or
those whose path matches a regular expression) and, each step, sends for each of them the
quantities of :mod:`probe.monitor.numerics_names` (activation, weight, gradient and optimizer-state
norms, the update ratio across the optimizer step, NaN/Inf counts) as metric points named
``numerics:<module>:<quantity>``.

Cheap by construction: every tensor is reduced where it lives by the dump's statistics backend
(:class:`probe.engine_adapter.torch_stats.TorchStats`: one stacked reduction per tensor on an
accelerator, one native pass on the CPU), and the step's handles are read with **one**
:meth:`~probe.engine_adapter.base.StatsBackend.gather` at the step's end: no host-device
synchronisation per tensor. The output of a module is reduced in its forward hook; the weights,
gradients and optimizer state right after ``optimizer.step()`` (a step post-hook), where the
update is read too: from the optimizer's own state for Adam, AdamW and SGD
(:mod:`probe.engine_adapter.optimizer_update`: on the CPU one native pass reads weight, moments and
update together, no copy of the weights), otherwise as the difference from a copy taken just
before the step (``update_ratio=False`` spares both).

The points go through the rank's monitor agent (:class:`probe.monitor.agent.monitor_agent.MonitorAgent`, which the
:class:`~probe.monitor.agent.callback.MonitorAgentCallback` puts in ``ctx.extra["monitor_agent"]``):
bounded, acknowledged and spooled like the other points. Each module's points carry the time of
its forward pass, so the service can tell the modules' execution order (which module showed a
NaN first). Without a monitor agent the points are added to the step's metrics instead (the
bundled engine writes those to the run's store).

>>> import torch
>>> from probe.engine_adapter.callbacks import TrainContext
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
>>> opt = torch.optim.Adam(model.parameters(), lr=0.1)
>>> ctx = TrainContext(0, 1, "doc", "/tmp", "script", "", None, model, opt, None, 1, None)
>>> cb = NumericsCallback()
>>> cb.on_train_start(ctx)
>>> cb.modules
['0', '2']
>>> cb.on_step_start(ctx, 0)
>>> model(torch.ones(5, 4)).sum().backward(); opt.step()
>>> metrics = {}
>>> cb.on_step_end(ctx, 0, metrics)
>>> sorted(k for k in metrics if k.startswith("numerics:2:"))   # doctest: +NORMALIZE_WHITESPACE
['numerics:2:activation_norm', 'numerics:2:grad_norm', 'numerics:2:nonfinite',
 'numerics:2:optimizer_state_norm', 'numerics:2:update_ratio', 'numerics:2:weight_norm']
>>> round(metrics["numerics:0:weight_norm"], 6) == round(float(torch.cat(
...     [p.detach().reshape(-1) for p in model[0].parameters()]).norm()), 6)
True
>>> cb.on_train_end(ctx)
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

from probe.engine_adapter.callbacks import TrainCallback, TrainContext
from probe.monitor.numerics_names import metric_name

log = logging.getLogger(__name__)

#: ``ctx.extra`` key under which the monitor agent callback leaves its agent.
AGENT_KEY = "monitor_agent"


def select_modules(model: Any, pattern: str | None = None) -> list[tuple[str, Any]]:
    """``(path, module)`` of the modules to watch, in registration order.

    No ``pattern``: every leaf module with parameters (its own, none in a sub-module). With a
    regular expression: every module (not the root) with parameters whose path it matches
    (``re.search``; anchor it, ``^layers\\.\\d+$``, to pick whole blocks).

    >>> import torch
    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    >>> [p for p, _ in select_modules(m)], [p for p, _ in select_modules(m, "^1$")]
    (['0', '1.0'], ['1'])
    """
    out = []
    rx = re.compile(pattern) if pattern else None
    for path, mod in model.named_modules():
        if not path or next(mod.parameters(), None) is None:
            continue
        if rx is None:
            own = next(mod.parameters(recurse=False), None) is not None
            inner = any(next(c.parameters(), None) is not None for c in mod.children())
            if own and not inner:
                out.append((path, mod))
        elif rx.search(path):
            out.append((path, mod))
    return out


class NumericsCallback(TrainCallback):
    """Per-module numerics every step; see the module docstring.

    ``pattern``: a regular expression on module paths (None: every leaf module with
    parameters). ``update_ratio``: measure the update across the optimizer step (keeps a copy of
    the watched weights). ``every``: measure every N-th step only (1: every step).

    >>> from probe.engine_adapter.callbacks import CallbackSpec
    >>> CallbackSpec(NumericsCallback, {"pattern": "mlp"}).build().pattern
    'mlp'
    """

    def __init__(self, pattern: str | None = None, update_ratio: bool = True,
                 every: int = 1) -> None:
        if pattern:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"numerics pattern {pattern!r}: {e}") from None
        self.pattern = pattern or None
        self.update_ratio = update_ratio
        self.every = max(1, int(every))
        self.modules: list[str] = []
        self._mods: list[Any] = []
        self._params: list[Any] = []          # unique watched parameters
        self._mod_params: list[list[int]] = []  # per module: indices into _params
        self._hooks: list[Any] = []
        self._opt: Any = None
        self._stats: Any = None
        self._act: list[list[Any]] = []       # per module: this step's output handles
        self._act_time: list[int] = []        # per module: time of its first forward this step
        self._before: list[Any] = []          # per parameter: a copy before the step, or None
        self._copied: list[bool] = []         # per parameter: copied before this step
        self._exact: list[bool] = []          # per parameter: update read from optimizer state
        self._param_h: list[Any] = []         # per parameter: (weight, grad, states, update)
        self._stepped = False
        self._on = False
        self._measuring = True                # this step is measured (see ``every``)
        #: wall time spent in the callback's own work so far (hooks and the step's end)
        self.seconds = 0.0

    # -- set-up ---------------------------------------------------------------------------------

    def on_train_start(self, ctx: TrainContext) -> None:
        import torch

        model = ctx.model
        if not isinstance(model, torch.nn.Module):
            log.warning("probe numerics: no torch model in this run; numerics are off")
            return
        from probe.engine_adapter.torch_stats import TorchStats

        self._stats = TorchStats()
        chosen = select_modules(model, self.pattern)
        if not chosen:
            log.warning("probe numerics: %s; numerics are off",
                        f"no module with parameters matches {self.pattern!r}" if self.pattern
                        else "the model has no module with parameters")
            return
        index: dict[int, int] = {}
        for path, mod in chosen:
            ids = []
            for p in mod.parameters():
                if id(p) not in index:
                    index[id(p)] = len(self._params)
                    self._params.append(p)
                ids.append(index[id(p)])
            self.modules.append(path)
            self._mods.append(mod)
            self._mod_params.append(ids)
        self._act = [[] for _ in chosen]
        n = len(self._params)
        self._before, self._copied, self._exact = [None] * n, [False] * n, [False] * n
        self._param_h = [None] * n
        self._act_time = [0] * len(chosen)
        for i, mod in enumerate(self._mods):
            self._hooks.append(mod.register_forward_hook(self._forward_hook(i)))
        opt = self._opt = ctx.optimizer
        if opt is not None and self.update_ratio and hasattr(opt, "param_groups"):
            from probe.engine_adapter.optimizer_update import reads_update

            for group in opt.param_groups:
                known = reads_update(opt, group)
                for q in group["params"]:
                    j = index.get(id(q))
                    if j is not None:
                        self._exact[j] = known
        if opt is not None and hasattr(opt, "register_step_pre_hook"):
            if self.update_ratio:
                self._hooks.append(opt.register_step_pre_hook(lambda *a: self._snapshot()))
            else:
                self._hooks.append(opt.register_step_pre_hook(lambda *a: self._mark_step()))
            self._hooks.append(opt.register_step_post_hook(lambda *a: self._after_step()))
        self._on = True

    def _forward_hook(self, i: int):
        acts, times, stats = self._act, self._act_time, self._stats

        def hook(module, args, output):
            if not self._measuring:
                return None
            t0 = time.perf_counter()
            t = output
            if isinstance(t, (tuple, list)) and t:
                t = t[0]
            if getattr(t, "is_floating_point", None) is None or not t.is_floating_point():
                return None
            handle = stats.reduce(t, stats.describe(t).kind)
            if handle is not None:
                if not acts[i]:
                    times[i] = time.time_ns()
                acts[i].append(handle)
            self.seconds += time.perf_counter() - t0
            return None
        return hook

    # -- the optimizer step ---------------------------------------------------------------------

    def _snapshot(self) -> None:
        """Before ``optimizer.step()``: copy the weights whose update cannot be read from the
        optimizer's state (none for Adam, AdamW and SGD; every one before the first step)."""
        import torch

        if not self._on or not self._measuring:
            return
        t0 = time.perf_counter()
        with torch.no_grad():
            for j, p in enumerate(self._params):
                if self._exact[j]:
                    continue
                buf = self._before[j]
                if buf is None:
                    buf = self._before[j] = torch.empty_like(
                        p, memory_format=torch.contiguous_format)
                buf.copy_(p.detach())
                self._copied[j] = True
        self._stepped = True
        self.seconds += time.perf_counter() - t0

    def _mark_step(self) -> None:
        self._stepped = self._on and self._measuring

    def _after_step(self) -> None:
        """After ``optimizer.step()``: every watched parameter's weight, gradient, optimizer
        state and update, reduced where they live (handles; read at the step's end). The update
        comes from the optimizer's state where :func:`probe.engine_adapter.optimizer_update.
        measure_param` knows it, else from the copy taken before the step."""
        import torch

        from probe.engine_adapter.optimizer_update import measure_param, state_tensors

        if not self._stepped:
            return
        t0 = time.perf_counter()
        stats, opt = self._stats, self._opt
        group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
        with torch.no_grad():
            for j, p in enumerate(self._params):
                g = p.grad
                gh = stats.reduce(g, stats.describe(g).kind) if g is not None else None
                group = group_of.get(id(p))
                got = (measure_param(stats, opt, group, p, gh)
                       if self.update_ratio and group is not None else None)
                self._exact[j] = got is not None
                if got is not None:
                    self._param_h[j] = (got.weight, gh, got.states, got.delta)
                    self._before[j] = None          # no copy needed from now on
                    continue
                delta = None
                if self._copied[j]:
                    buf = self._before[j]
                    buf.sub_(p.detach())
                    delta = stats.reduce(buf, stats.describe(buf).kind)
                w = stats.reduce(p, stats.describe(p).kind)
                states = [stats.reduce(t, stats.describe(t).kind)
                          for t in state_tensors(self._opt_state(p), p)]
                self._param_h[j] = (w, gh, states, delta)
        for j in range(len(self._copied)):
            self._copied[j] = False
        self._stepped = False
        self.seconds += time.perf_counter() - t0

    # -- per step -------------------------------------------------------------------------------

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        self._measuring = self._on and step % self.every == 0
        for a in self._act:
            a.clear()
        self._param_h = [None] * len(self._params)
        self._stepped = False

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        if not self._on or not self._measuring:
            return
        t0 = time.perf_counter()
        points = self.measure()
        agent = ctx.extra.get(AGENT_KEY)
        if agent is None:
            for values in points.values():
                metrics.update(values)
            self.seconds += time.perf_counter() - t0
            return
        end = time.time_ns()
        order = sorted(range(len(self.modules)),
                       key=lambda i: (self._act_time[i] if self._act[i] else end, i))
        for i in order:
            agent.record(step, points[self.modules[i]],
                         time_ns=self._act_time[i] if self._act[i] else end)
        self.seconds += time.perf_counter() - t0

    def measure(self) -> dict[str, dict[str, float]]:
        """This step's points per module (``{module: {metric name: value}}``), read with one
        gather of every handle started this step."""
        from probe.engine_adapter.optimizer_update import state_tensors

        stats = self._stats
        handles: list[Any] = []
        weight_at, grad_at, state_at, delta_at = [], [], [], []
        for j, p in enumerate(self._params):
            got = self._param_h[j]
            if got is None:                 # no optimizer step seen: read everything now
                g = p.grad
                got = (stats.reduce(p, stats.describe(p).kind),
                       stats.reduce(g, stats.describe(g).kind) if g is not None else None,
                       [stats.reduce(t, stats.describe(t).kind)
                        for t in state_tensors(self._opt_state(p), p)], None)
            w, g, states, delta = got
            weight_at.append(len(handles))
            handles.append(w)
            grad_at.append(len(handles) if g is not None else -1)
            if g is not None:
                handles.append(g)
            state_at.append(list(range(len(handles), len(handles) + len(states))))
            handles += states
            delta_at.append(len(handles) if delta is not None else -1)
            if delta is not None:
                handles.append(delta)
        act_at = []
        for acts in self._act:
            act_at.append((len(handles), len(acts)))
            handles += acts
        values = stats.gather(handles)

        def sumsq(i: int) -> float:
            v = values[i]
            return v[3] if v is not None and len(v) >= 6 else 0.0

        def bad(i: int) -> float:
            v = values[i]
            return v[4] + v[5] if v is not None and len(v) >= 6 else 0.0

        out: dict[str, dict[str, float]] = {}
        for m, ids in enumerate(self._mod_params):
            w = sum(sumsq(weight_at[j]) for j in ids)
            g = sum(sumsq(grad_at[j]) for j in ids if grad_at[j] >= 0)
            s = sum(sumsq(k) for j in ids for k in state_at[j])
            first, n = act_at[m]
            a = sum(sumsq(k) for k in range(first, first + n))
            nonfinite = (sum(bad(weight_at[j]) for j in ids)
                         + sum(bad(grad_at[j]) for j in ids if grad_at[j] >= 0)
                         + sum(bad(k) for k in range(first, first + n)))
            path = self.modules[m]
            row = {}
            if n:
                row[metric_name(path, "activation_norm")] = math.sqrt(a)
            row[metric_name(path, "weight_norm")] = math.sqrt(w)
            if any(grad_at[j] >= 0 for j in ids):
                row[metric_name(path, "grad_norm")] = math.sqrt(g)
            if self.update_ratio and all(delta_at[j] >= 0 for j in ids):
                d = sum(sumsq(delta_at[j]) for j in ids)
                wn = math.sqrt(w)
                row[metric_name(path, "update_ratio")] = (math.sqrt(d) / wn if wn > 0
                                                          else (0.0 if d == 0 else math.inf))
            if any(state_at[j] for j in ids):
                row[metric_name(path, "optimizer_state_norm")] = math.sqrt(s)
            row[metric_name(path, "nonfinite")] = nonfinite
            out[path] = row
        return out

    @property
    def weights_copied(self) -> int:
        """How many watched parameters keep a copy for their update (those whose optimizer
        :mod:`probe.engine_adapter.optimizer_update` cannot read the update from)."""
        return sum(b is not None for b in self._before)

    def _opt_state(self, p: Any) -> Any:
        return None if self._opt is None else self._opt.state.get(p)

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._before = [None] * len(self._params)
        self._param_h = [None] * len(self._params)
        self._on = False

