"""What an eager training loop spends beyond its ops: Python, module calls, autograd, optimizer.

A calibrated op time (:mod:`probe.simulator.replay`, :mod:`probe.simulator.calibrate`) is the op alone. A
real step also pays, per op, the Python call and the autograd bookkeeping, and per
``nn.Module`` call its ``__call__``. Measured here on this machine:

1. one small pre-norm transformer (two blocks, d=64, AdamW) is trained for real twice, once
   calling its submodules and once doing the same math with ``torch.nn.functional`` from one
   module, their steps taken in turn, each phase (forward, backward, optimizer) timed on the
   given clock, the fastest of the steps after two warm-up steps;
2. both are simulated with each of their ops replayed alone, right after their real steps; the
   difference per phase is what the loop adds;
3. a module call's own cost (``nn.Module.__call__`` around a forward that does nothing, less
   the forward called directly) is timed on its own: solving it from the two runs' difference
   divided a small difference of two noisy figures by the number of calls (0 to 28 µs on one
   machine between calibrations);
4. forward: ``extra = per_op * ops + per_call * module_calls``; backward and the optimizer: per
   op. Steps 1-2 are done ``ROUNDS`` times, each with freshly built models, and each figure
   is the median of its rounds: a model's loop runs at different speeds from build to build
   here (forward 1.4-1.5 ms or 2.0-2.4 ms, its ops replayed alone the same in both), and one
   round alone moved the per-op figure from 0.6 to 11 µs.

>>> import time, torch
>>> from probe.simulator.calibrate import calibrate
>>> curves = calibrate("cpu", max_call_s=0.001, min_time_s=0.001).curves
>>> sorted(curves["op_overhead_s"])
['backward', 'forward', 'module_call', 'optimizer', 'other']
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import torch
import torch.nn.functional as F

from probe.simulator.devices import Device
from probe.simulator.fake_run import FakeRun
from probe.simulator.replay import replay_seconds
from probe.simulator.timing import op_seconds, phase_seconds
from probe.simulator.trace import BACKWARD, FORWARD, OPTIMIZER, OTHER

D, HEADS, VOCAB, STEPS, ROUNDS = 64, 4, 256, 12, 3


def measure_overhead(dev: torch.device, curves: dict, clock: Callable[[], float]) -> dict[str, float]:
    """Seconds the loop adds per op of each phase and per module call (module docstring)."""
    per_call = _module_call_seconds(clock)
    rounds = [_round(dev, curves, clock, per_call) for _ in range(ROUNDS)]
    per_op, back, opt = (statistics.median(r[i] for r in rounds) for i in range(3))
    return {"other": per_op, "forward": per_op, "module_call": per_call,
            "backward": back, "optimizer": opt}


def _round(dev: torch.device, curves: dict, clock: Callable[[], float],
           per_call: float) -> tuple[float, float, float]:
    """(forward per op, backward per op, optimizer per op) from one round of real
    steps of both models, each model's replay right after."""
    spent = _fastest_phases(dev, clock)
    extra = ops = calls = 0
    back, opt = [], []
    for functional in (False, True):
        e, o, c, b, p = _measure(dev, curves, clock, functional, spent[functional])
        extra, ops, calls = extra + e, ops + o, calls + c
        back.append(b)
        opt.append(p)
    return (max(0.0, (extra - per_call * calls) / max(1, ops)),
            statistics.fmean(back), statistics.fmean(opt))


def _module_call_seconds(clock: Callable[[], float]) -> float:
    """``module(x)`` less ``module.forward(x)`` for a forward that returns its input."""
    from probe.simulator.clock import Timer

    class Nothing(torch.nn.Module):
        def forward(self, x):
            return x

    module, x = Nothing(), torch.zeros(1)
    timer = Timer(lambda: None, 0.02, clock, samples=7)
    return max(0.0, timer(lambda: module(x)) - timer(lambda: module.forward(x)))


def _fastest_phases(dev: torch.device, clock: Callable[[], float]) -> dict[bool, list[float]]:
    """Each phase's fastest seconds over ``STEPS`` real steps (two warm-up steps first) of the
    module-calling and the functional model, their steps taken in turn: a slow stretch of a
    shared machine then falls on both alike."""
    built = {functional: _build(dev, functional) for functional in (False, True)}
    real: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for _ in range(STEPS):
        for functional, run in built.items():
            real[functional].append(_step(*run, clock))
    return {functional: [min(r[i] for r in steps[2:]) for i in range(3)]
            for functional, steps in real.items()}


def _measure(dev: torch.device, curves: dict, clock: Callable[[], float], functional: bool,
             spent: list[float]) -> tuple[float, int, int, float, float]:
    """(forward extra seconds, forward ops, module calls, backward and optimizer extra per op)."""
    with FakeRun(max_steps=2, signatures=True) as run:
        fake = _build(dev, functional)
        while True:
            _step(*fake, clock)
    probe = Device(name="probe", kind=dev.type, memory_bytes=0, peak_flops={}, memory_bw=1.0,
                   link_intra_bw=1.0, link_inter_bw=1.0, ranks_per_node=1, link_latency_s=0.0,
                   launch_s=0.0, curves={**curves, "op_overhead_s": {}})
    trace = run.tracer.trace
    own = phase_seconds(trace, op_seconds(trace, probe, replay_seconds(trace, probe, cache=False)), 1)
    count = {p: sum(1 for s, ph in zip(trace.op_step, trace.op_phase) if s == 1 and ph == p)
             for p in (OTHER, FORWARD, BACKWARD, OPTIMIZER)}
    calls = sum(c for s, c in zip(trace.op_step, trace.op_calls) if s == 1)
    return (spent[0] - own["other"] - own["forward"], count[OTHER] + count[FORWARD], calls,
            max(0.0, (spent[1] - own["backward"]) / max(1, count[BACKWARD])),
            max(0.0, (spent[2] - own["optimizer"]) / max(1, count[OPTIMIZER])))


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc1, self.fc2 = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _block(x, self.norm1, self.qkv, self.proj, self.norm2, self.fc1, self.fc2)

    def functional(self, x: torch.Tensor) -> torch.Tensor:
        """The same math without calling a submodule."""
        def norm(m):
            return lambda y: F.layer_norm(y, (D,), m.weight, m.bias)

        def linear(m):
            return lambda y: F.linear(y, m.weight, m.bias)

        return _block(x, norm(self.norm1), linear(self.qkv), linear(self.proj), norm(self.norm2),
                      linear(self.fc1), linear(self.fc2))


def _block(x, norm1, qkv, proj, norm2, fc1, fc2):
    b, t, _ = x.shape
    q, k, v = qkv(norm1(x)).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
    att = (q @ k.transpose(-2, -1) / math.sqrt(D // HEADS)).softmax(-1)
    x = x + proj((att @ v).transpose(1, 2).reshape(b, t, D))
    return x + fc2(F.gelu(fc1(norm2(x))))


class _Model(torch.nn.Module):
    def __init__(self, functional: bool) -> None:
        super().__init__()
        self.use_functional = functional
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.use_functional:
            x = F.embedding(tokens, self.embed.weight)
            for block in self.blocks:
                x = block.functional(x)
            return F.linear(x, self.head.weight, self.head.bias)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _build(dev: torch.device, functional: bool) -> tuple:
    model = _Model(functional).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    return model, optimizer, torch.randint(0, VOCAB, (4, 32), device=dev)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
          clock: Callable[[], float]) -> tuple[float, float, float]:
    """One training step; the clock's seconds in forward, backward and the optimizer."""
    t0 = clock()
    optimizer.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
    t1 = clock()
    loss.backward()
    t2 = clock()
    optimizer.step()
    return t1 - t0, t2 - t1, clock() - t2
