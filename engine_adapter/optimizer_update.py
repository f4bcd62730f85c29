"""The weight update an optimizer step made, read from the optimizer's own state: no weight copy.

The update ratio ``||W_after - W_before|| / ||W_after||`` needs the update. Copying every watched
weight before ``optimizer.step()`` and subtracting after costs five passes over the weights (a
copy's read and write, a subtraction's two reads and a write) each step. For the optimizers that
train most models the update is a function of what the step leaves behind, so
:func:`measure_param` reads it from there, in the pass that reads the weight and the optimizer
state for their own norms anyway:

- **Adam / AdamW** (also AMSGrad, ``maximize``, any implementation: for-loop, foreach, fused):
  ``step_size * m / (sqrt(v) / sqrt(bc2) + eps)``, with AdamW's decoupled decay folded in as
  ``(lr * wd * W_after + that) / (1 - lr * wd)``; on the CPU one native pass reads W, m and v
  once for the weight, state and update norms together (``stats_kernel.c``);
- **SGD with momentum** (not Nesterov): ``lr * buffer``, so the update norm is ``lr`` times the
  momentum buffer's, which the state norm reads anyway: free;
- **plain SGD without weight decay**: ``lr * grad``: free.

Equal to the copy-and-subtract measure up to float rounding of the weights (the stored weight is
rounded after the step; an update below a weight's last bit is measured here, not lost there).
Anything else (another optimizer, Nesterov, plain SGD with weight decay, tensor subclasses, a
learning rate of a foreign type) returns None: the caller keeps its copy for that weight.

>>> import torch
>>> from probe.engine_adapter.torch_stats import TorchStats
>>> torch.manual_seed(0) and None
>>> w = torch.nn.Parameter(torch.randn(1000))
>>> opt = torch.optim.AdamW([w], lr=0.01, weight_decay=0.1)
>>> before = w.detach().clone()
>>> (w * w).sum().backward(); opt.step()
>>> got = measure_param(TorchStats(), opt, opt.param_groups[0], w, None)
>>> exact = float((w.detach() - before).norm())
>>> abs(TorchStats().gather([got.delta])[0][3] ** 0.5 / exact - 1) < 1e-5
True
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from probe.engine_adapter.torch_stats import TorchStats, native_kernel

_NAN = math.nan


class ParamMeasure(NamedTuple):
    """Statistics handles of one parameter after the optimizer step (``TorchStats`` handles:
    a finished list on the CPU, a device tensor elsewhere; element 3 is the sum of squares,
    4 and 5 the NaN and Inf counts). ``weight`` may carry only those three (the others NaN)."""

    weight: Any
    states: list[Any]
    delta: Any


def _number(x: Any) -> float | None:
    if isinstance(x, torch.Tensor):
        return float(x) if x.numel() == 1 else None
    return float(x) if isinstance(x, (int, float)) else None


def _scaled(handle: Any, factor: float) -> Any:
    if handle is None:
        return None
    if isinstance(handle, list):
        return [v * factor for v in handle]
    return handle * factor


def state_tensors(state: Any, p: torch.Tensor) -> list[torch.Tensor]:
    """The optimizer-state tensors of parameter ``p`` shaped like it (Adam's moments, a
    momentum buffer; not the step count)."""
    if not state:
        return []
    return [v for v in state.values()
            if getattr(v, "shape", None) == p.shape and v.is_floating_point()]


def reads_update(optimizer: Any, group: dict) -> bool:
    """Whether :func:`measure_param` will read the update of this group's parameters from the
    optimizer's state (so no copy of the weights is needed before the first step).

    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> [reads_update(o, o.param_groups[0]) for o in (torch.optim.AdamW([w]),
    ...  torch.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True), torch.optim.RMSprop([w]))]
    [True, False, False]
    """
    lr = _number(group.get("lr"))
    if lr is None:
        return False
    if isinstance(optimizer, torch.optim.Adam):
        decay = lr * (_number(group.get("weight_decay", 0)) or 0.0)
        return not (group.get("decoupled_weight_decay") and decay >= 1.0)
    if type(optimizer) is torch.optim.SGD:
        if _number(group.get("momentum", 0)):
            return not group.get("nesterov")
        return not _number(group.get("weight_decay", 0))
    return False


def measure_param(stats: TorchStats, optimizer: Any, group: dict, p: torch.Tensor,
                  grad_handle: Any) -> ParamMeasure | None:
    """Weight, optimizer-state and update handles of ``p`` just after ``optimizer.step()``, the
    update read from the optimizer's state (see the module docstring); None when the optimizer
    or its settings are not among those it knows (the caller measures the update by copy).

    ``grad_handle``: the handle of ``p.grad`` (plain SGD's update is ``lr`` times it)."""
    lr = _number(group.get("lr"))
    if lr is None or type(p) not in (torch.Tensor, torch.nn.Parameter):
        return None
    state = optimizer.state.get(p) or {}
    if isinstance(optimizer, torch.optim.Adam):     # AdamW is an Adam with decoupled decay
        return _adam(stats, group, p, state, lr)
    if type(optimizer) is torch.optim.SGD:
        return _sgd(stats, group, p, state, lr, grad_handle)
    return None


def _sgd(stats: TorchStats, group: dict, p: torch.Tensor, state: dict, lr: float,
         grad_handle: Any) -> ParamMeasure | None:
    momentum = _number(group.get("momentum", 0)) or 0.0
    tensors = state_tensors(state, p)
    if momentum:       # the update is lr * the momentum buffer, the one state tensor
        buf = state.get("momentum_buffer")
        if group.get("nesterov") or len(tensors) != 1 or tensors[0] is not buf:
            return None
    elif (_number(group.get("weight_decay", 0)) or 0.0) != 0.0 or grad_handle is None:
        return None    # plain SGD with decay: the update needs the weight before the step
    weight = stats.reduce(p, stats.describe(p).kind)
    states = [stats.reduce(t, stats.describe(t).kind) for t in tensors]
    return ParamMeasure(weight, states, _scaled(states[0] if momentum else grad_handle, lr * lr))


def _adam(stats: TorchStats, group: dict, p: torch.Tensor, state: dict,
          lr: float) -> ParamMeasure | None:
    m = state.get("exp_avg")
    v = state.get("max_exp_avg_sq") if group.get("amsgrad") else state.get("exp_avg_sq")
    step = _number(state.get("step"))
    betas = group.get("betas")
    eps, wd = _number(group.get("eps")), _number(group.get("weight_decay", 0))
    if (not isinstance(m, torch.Tensor) or not isinstance(v, torch.Tensor) or not step
            or not betas or eps is None or wd is None):
        return None
    b1, b2 = _number(betas[0]), _number(betas[1])
    if b1 is None or b2 is None:
        return None
    decay = lr * wd if group.get("decoupled_weight_decay") else 0.0
    if decay >= 1.0:
        return None
    consts = [lr / (1 - b1 ** step), 1 / math.sqrt(1 - b2 ** step), eps, decay, 1 / (1 - decay)]
    others = [t for t in state_tensors(state, p) if t is not m and t is not v]
    states = [stats.reduce(t, stats.describe(t).kind) for t in others]
    got = _adam_native(p, m, v, consts)
    if got is not None:
        sw, sm, sv, su, nan, inf = got
        return ParamMeasure([_NAN, _NAN, _NAN, sw, nan, inf],
                            states + [[_NAN, _NAN, _NAN, sm, 0.0, 0.0],
                                      [_NAN, _NAN, _NAN, sv, 0.0, 0.0]],
                            [_NAN, _NAN, _NAN, su, 0.0, 0.0])
    with torch.no_grad():
        w = p.detach()
        step_size, inv_bc2, _, decay, scale = consts
        u = torch.addcdiv(w * decay, m, v.sqrt().mul_(inv_bc2).add_(eps), value=step_size)
        if scale != 1.0:
            u.mul_(scale)
    return ParamMeasure(stats.reduce(w, stats.describe(w).kind),
                        states + [stats.reduce(m, stats.describe(m).kind),
                                  stats.reduce(v, stats.describe(v).kind)],
                        stats.reduce(u, stats.describe(u).kind))


def _adam_native(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                 consts: list[float]) -> tuple[float, ...] | None:
    """The one-pass CPU kernel on contiguous float32/float64 tensors of one dtype, or None."""
    dtype = p.dtype
    if (dtype not in (torch.float32, torch.float64) or m.dtype != dtype or v.dtype != dtype
            or not (p.is_cpu and m.is_cpu and v.is_cpu)
            or not (p.is_contiguous() and m.is_contiguous() and v.is_contiguous())):
        return None
    kernel = native_kernel()
    if not kernel:
        return None
    import numpy as np

    fn = kernel[4] if dtype == torch.float32 else kernel[5]
    c = np.asarray(consts, dtype=np.float64)
    out = np.zeros(6, dtype=np.float64)
    fn(p.data_ptr(), m.data_ptr(), v.data_ptr(), p.numel(), c.ctypes.data, out.ctypes.data)
    return tuple(out.tolist())
