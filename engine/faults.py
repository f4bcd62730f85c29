"""Faults planted on request, for the other features to find.

Written ``KIND:TARGET:ARG``:

- ``scale:<parameter name>:<factor>`` multiplies one weight (a parameter name, or a module name
  whose ``weight`` is meant) by ``factor`` before training;
- ``grow:<parameter name>:<rate>`` multiplies one weight (a parameter name, or a module name
  whose ``weight`` is meant) by ``1 + rate`` at the start of every step (before its module's
  first forward of the step): the layer's weights, outputs and gradients grow step after step
  until the loss turns NaN (a diverging layer, for the monitor's numerics to find);
- ``nan:<module name>:<step>`` writes NaN into that module's forward output at that step;
- ``nangrad:<module name>:<step>`` writes NaN into the gradient that module's backward hands to
  its first input at that step (its forward, and the gradient of its output, stay finite: a NaN
  born in the backward only);
- ``overflow:<module name>:<step>`` multiplies that module's forward output by
  :data:`OVERFLOW_GROWTH` to the power ``1, 2, 3, ...`` from that step on (a growing scale: the
  values overflow to Inf within a few steps);
- ``spike:<module name>:<step>`` multiplies that module's forward output by :data:`SPIKE_FACTOR`
  at that step only (a loss spike without NaN);
- ``slow:<rank>:<factor>`` makes that rank's compute take ``factor`` times as long: on a CPU
  rank it does ``factor - 1`` times its step's compute CPU time more work (a slower
  processor: the extra shows in its CPU time as in its wall time, unlike a neighbour taking
  its core, which shows only in wall time); on a device the host waits that much longer;
- ``perturb:<api name>:<call index>`` makes one API a wrong kernel at one call: the
  ``index``-th call of the API in every step (numbered as a dump names it:
  ``perturb:Functional.linear:3`` is ``Functional.linear.3.forward``) returns its output
  scaled by ``1 + PERTURB_REL`` (a relative 1e-3). APIs are named as dumps name them
  (``Torch.matmul``, ``Functional.softmax``, ``Tensor.__matmul__``);
- ``hang:<rank>:<step>`` makes that rank stop before its gradient all-reduce at that step:
  it sleeps for :data:`HANG_SLEEP_S` while the other ranks wait in the all-reduce (a hang,
  for the monitor to diagnose); the launcher's SIGTERM or its death ends it.

>>> [f.kind for f in parse_faults(["scale:layers.0.attn.q_proj.weight:1.5", "slow:1:3",
...                                "grow:layers.0.mlp.down_proj:0.2"])]
['scale', 'slow', 'grow']
>>> str(parse_fault("perturb:Functional.linear:3"))
'perturb:Functional.linear:3'

A module or parameter target may end in ``@RANK``: the fault is planted on that rank only.

>>> f = parse_fault("nan:layers.1.mlp@2:6"); (f.target, f.rank, str(f))
('layers.1.mlp', 2, 'nan:layers.1.mlp@2:6')
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import torch
from torch import nn

from probe.ground.errors import ProbeError

log = logging.getLogger(__name__)

KINDS = {
    "scale": "scale:<parameter name>:<factor>",
    "grow": "grow:<parameter name>:<rate>",
    "nan": "nan:<module name>:<step>",
    "nangrad": "nangrad:<module name>:<step>",
    "overflow": "overflow:<module name>:<step>",
    "spike": "spike:<module name>:<step>",
    "slow": "slow:<rank>:<factor>",
    "perturb": "perturb:<api name>:<call index>",
    "hang": "hang:<rank>:<step>",
}
#: how long a ``hang`` fault sleeps: far longer than anything waits for it
HANG_SLEEP_S = 24 * 3600.0
#: the relative error a ``perturb`` fault puts into its call's output
PERTURB_REL = 1e-3
#: an ``overflow`` fault's output scale grows by this factor every step
OVERFLOW_GROWTH = 1e10
#: a ``spike`` fault's output scale at its step
SPIKE_FACTOR = 1e3
#: the kinds that take a module and a step (and may take ``@RANK``)
_MODULE_STEP_KINDS = ("nan", "nangrad", "overflow", "spike")
#: the kinds whose target is a rank number (no ``@RANK``)
_RANK_KINDS = ("slow", "hang")
#: where the APIs a ``perturb`` fault names live (as dumps name them)
_API_FAMILIES = {"Torch": torch, "Functional": torch.nn.functional, "Tensor": torch.Tensor}


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    arg: float
    #: the one rank the fault is planted on (None: every rank)
    rank: int | None = None

    def __str__(self) -> str:
        where = "" if self.rank is None else f"@{self.rank}"
        return f"{self.kind}:{self.target}{where}:{self.arg:g}"

    def here(self, rank: int) -> bool:
        """Whether the fault is planted on ``rank``."""
        return self.rank is None or self.rank == rank


def parse_fault(text: str) -> Fault:
    """Parse one ``KIND:TARGET:ARG`` spec (the target may itself contain ':' only for none)."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in KINDS or not parts[1]:
        raise ProbeError(f"bad fault {text!r}; valid forms: {', '.join(KINDS.values())}")
    kind, target, arg_s = parts
    rank = None
    if "@" in target and kind not in _RANK_KINDS:
        target, _, rank_s = target.rpartition("@")
        if not rank_s.isdigit() or not target:
            raise ProbeError(f"bad fault {text!r}: @{rank_s} is not a rank number "
                             "(KIND:TARGET@RANK:ARG, e.g. nan:layers.1.mlp@2:6)")
        rank = int(rank_s)
    try:
        arg = float(arg_s)
    except ValueError:
        raise ProbeError(f"bad fault {text!r}: {arg_s!r} is not a number ({KINDS[kind]})") from None
    if kind in _MODULE_STEP_KINDS and (arg < 0 or arg != int(arg)):
        raise ProbeError(f"bad fault {text!r}: the step must be a non-negative integer")
    if kind == "perturb" and (arg < 0 or arg != int(arg)):
        raise ProbeError(f"bad fault {text!r}: the call index must be a non-negative integer")
    if kind in ("slow", "hang") and not target.isdigit():
        raise ProbeError(f"bad fault {text!r}: the target of {kind} is a rank number ({KINDS[kind]})")
    if kind == "hang" and (arg < 0 or arg != int(arg)):
        raise ProbeError(f"bad fault {text!r}: the step must be a non-negative integer")
    if kind == "grow" and not arg > 0:
        raise ProbeError(f"bad fault {text!r}: the growth rate must be > 0 (0.1: 10% a step)")
    if kind == "slow":
        if arg < 1:
            raise ProbeError(f"bad fault {text!r}: the slow-down factor must be >= 1")
    return Fault(kind, target, arg, rank)


def parse_faults(texts) -> list[Fault]:
    return [parse_fault(t) for t in texts]


def check_faults(faults: list[Fault], model: nn.Module, world_size: int) -> None:
    """Raise a ProbeError for a fault whose target does not exist in this run."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    for f in faults:
        if f.kind in ("scale", "grow") and f.target not in params and f.target + ".weight" not in params:
            near = [n for n in params if f.target.split(".")[-1] in n][:5] or list(params)[:5]
            raise ProbeError(f"fault {f}: no parameter {f.target!r} in this model; e.g. {', '.join(near)}")
        if f.kind in _MODULE_STEP_KINDS and f.target not in modules:
            near = [n for n in modules if n and f.target.split(".")[-1] in n][:5] or [n for n in modules if n][:5]
            raise ProbeError(f"fault {f}: no module {f.target!r} in this model; e.g. {', '.join(near)}")
        if f.kind == "perturb" and _api_owner(f.target) is None:
            raise ProbeError(f"fault {f}: no API {f.target!r}; name one as a dump does: "
                             "Functional.linear, Torch.matmul, Tensor.__matmul__")
        if f.kind in ("slow", "hang") and int(f.target) >= world_size:
            raise ProbeError(f"fault {f}: rank {f.target} does not exist with {world_size} "
                             f"rank{'' if world_size == 1 else 's'}")
        if f.rank is not None and f.rank >= world_size:
            raise ProbeError(f"fault {f}: rank {f.rank} does not exist with {world_size} "
                             f"rank{'' if world_size == 1 else 's'}")


class FaultPlanter:
    """Applies parsed faults to one rank's model and step loop."""

    def __init__(self, faults: list[Fault], rank: int) -> None:
        self.faults = faults
        self.rank = rank
        self.step = -1
        self._handles: list = []
        #: (wall, CPU) seconds of the last step's compute after its all-reduce, for slow_down
        self.tail = (0.0, 0.0)
        self.slow_factor = max([f.arg for f in faults if f.kind == "slow" and int(f.target) == rank],
                               default=1.0)
        self._patched: list[tuple[object, str, object]] = []
        self.hang_step = min([int(f.arg) for f in faults if f.kind == "hang" and int(f.target) == rank],
                             default=None)

    def apply(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        modules = dict(model.named_modules())
        for f in self.faults:
            if not f.here(self.rank):
                continue
            if f.kind == "scale":
                p = params[f.target] if f.target in params else params[f.target + ".weight"]
                with torch.no_grad():
                    p.mul_(f.arg)
            elif f.kind == "grow":
                name = f.target if f.target in params else f.target + ".weight"
                owner = modules[name.rpartition(".")[0]]
                self._handles.append(owner.register_forward_pre_hook(
                    self._grow_hook(params[name], 1.0 + f.arg)))
            elif f.kind == "nan":
                self._handles.append(modules[f.target].register_forward_hook(self._nan_hook(int(f.arg))))
            elif f.kind in ("overflow", "spike"):
                self._handles.append(modules[f.target].register_forward_hook(
                    self._scale_hook(f.kind, int(f.arg))))
            elif f.kind == "nangrad":
                self._nan_grad(modules[f.target], int(f.arg))
            elif f.kind == "perturb":
                self._perturb(f.target, int(f.arg))

    def _perturb(self, api: str, at_call: int) -> None:
        """Put a wrapper in front of ``api`` that scales the output of its ``at_call``-th call of
        every step; ``__probe_fault_original__`` names the true function (a precision check
        replays that one)."""
        owner, attr = _api_owner(api)
        orig = getattr(owner, attr)
        counter = {"step": None, "n": 0}

        @functools.wraps(orig)
        def wrong_kernel(*args, **kwargs):
            out = orig(*args, **kwargs)
            if counter["step"] != self.step:
                counter["step"], counter["n"] = self.step, 0
            n = counter["n"]
            counter["n"] = n + 1
            if n == at_call and isinstance(out, torch.Tensor) and out.is_floating_point():
                out = _scaled(out, 1.0 + PERTURB_REL)
            return out

        wrong_kernel.__probe_fault_original__ = orig
        setattr(owner, attr, wrong_kernel)
        self._patched.append((owner, attr, orig))

    def _grow_hook(self, param: nn.Parameter, factor: float):
        grown = {"step": None}

        def hook(module, args):
            if grown["step"] != self.step:
                grown["step"] = self.step
                with torch.no_grad():
                    param.mul_(factor)
            return None
        return hook

    def _nan_hook(self, at_step: int):
        def hook(module, args, output):
            if self.step != at_step:
                return None
            return _poison(output)
        return hook

    def _scale_hook(self, kind: str, at_step: int):
        def hook(module, args, output):
            if self.step < at_step or (kind == "spike" and self.step != at_step):
                return None
            factor = SPIKE_FACTOR if kind == "spike" else OVERFLOW_GROWTH ** (self.step - at_step + 1)
            return _scaled_output(output, factor)
        return hook

    def _nan_grad(self, module: nn.Module, at_step: int) -> None:
        """At ``at_step`` the module's first floating input goes through :class:`_PoisonGrad`
        inside its call (a wrapper of its ``forward``: the hooks before it see the true input),
        whose backward writes NaN into the gradient it hands back."""
        original = module.forward

        @functools.wraps(original)
        def forward(*args, **kwargs):
            if self.step == at_step and args and isinstance(args[0], torch.Tensor) \
                    and args[0].is_floating_point() and args[0].requires_grad:
                args = (_PoisonGrad.apply(args[0]),) + tuple(args[1:])
            return original(*args, **kwargs)

        module.forward = forward
        self._patched.append((module, "forward", None))

    def slow_down(self, compute_seconds: float, cpu_seconds: float | None = None) -> None:
        """Make this rank's compute take ``slow_factor`` times as long: with ``cpu_seconds``
        (the step's compute CPU time, a CPU rank) by working on this thread until its CPU
        clock has run ``slow_factor - 1`` times that more; else by sleeping ``slow_factor - 1``
        times ``compute_seconds`` (a slower device, which the host waits for)."""
        if self.slow_factor <= 1.0:
            return
        if cpu_seconds is None:
            time.sleep(compute_seconds * (self.slow_factor - 1.0))
            return
        end = time.thread_time() + cpu_seconds * (self.slow_factor - 1.0)
        while time.thread_time() < end:
            sum(range(2000))                                # ~20 us of interpreter work

    def hang_before_collective(self, step: int) -> None:
        """At the ``hang`` fault's step, stop here (before the all-reduce) for good."""
        if step == self.hang_step:
            log.warning(f"probe: rank {self.rank}: planted hang at step {step}: stopped before "
                        "the all-reduce")
            time.sleep(HANG_SLEEP_S)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for owner, attr, orig in reversed(self._patched):
            if orig is None:          # an instance attribute over the class's own
                owner.__dict__.pop(attr, None)
            else:
                setattr(owner, attr, orig)
        self._patched.clear()


def _api_owner(api: str) -> tuple[object, str] | None:
    """``(owner, attribute)`` of an API named as dumps name it, or None."""
    family, _, attr = api.partition(".")
    owner = _API_FAMILIES.get(family)
    if owner is None or not attr or not callable(getattr(owner, attr, None)):
        return None
    return owner, attr


def _scaled(out: torch.Tensor, factor: float) -> torch.Tensor:
    """``out`` times ``factor``, the gradient flowing through. (In bfloat16 a relative 1e-3 is
    under half a unit in the last place: the product rounds back to ``out``; plant it in a
    float32 run.)"""
    return out * factor


class _PoisonGrad(torch.autograd.Function):
    """Identity forward; the backward hands back the gradient with a NaN in it."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad.view(-1)[0] = float("nan")
        return grad


def _scaled_output(output, factor: float):
    if isinstance(output, torch.Tensor) and output.is_floating_point():
        return output * factor
    if isinstance(output, tuple) and output:
        return (_scaled_output(output[0], factor),) + tuple(output[1:])
    return output


def _poison(output):
    if isinstance(output, torch.Tensor) and output.is_floating_point():
        out = output.clone()
        out.view(-1)[0] = float("nan")
        return out
    if isinstance(output, tuple) and output:
        return (_poison(output[0]),) + tuple(output[1:])
    return output
