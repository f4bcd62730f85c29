"""Time a trace's ops by running each distinct one for real on this machine.

A calibrated device (``probe simulate --calibrate``) is this machine. Curves by size
(:mod:`probe.simulator.timing`) miss how much kernels of the same size differ (on a CPU an ``abs`` or a
``sqrt`` costs several times an ``add`` of the same bytes; a matmul's speed depends on its
shape and transposition), so for it every distinct op signature of the trace (op, argument
shapes, strides, dtypes and values, kept by :class:`~probe.simulator.trace.OpTracer`) is run on real
inputs and timed:

1. each tensor argument is made real with its shape, strides and dtype: floating point values
   uniform in [0.5, 1.5) (no NaN or denormal paths), integers and booleans zero (a valid index
   into anything);
2. the op is called as traced, on :mod:`probe.simulator.clock`'s clock, the fastest of batches, in
   ``PASSES`` passes over all the ops (the fastest of them): a slow stretch of a shared machine
   (a virtual CPU the host takes away counts on even the thread's own clock) lasts longer than
   one op's batches, but seldom across both passes;
3. times are cached in the user cache per device calibration, so the next simulation of the
   same shapes runs nothing; ops larger than ``max_flops`` / ``max_bytes``, collectives and ops
   that cannot be rebuilt (an in-place write into an expanded tensor) stay NaN: the curves
   time those.

>>> import torch
>>> from probe.simulator.trace import OpTracer
>>> from probe.simulator.calibrate import calibrate
>>> with OpTracer(signatures=True) as tracer:
...     x = torch.ones(64, 64)
...     y = x @ x
>>> device = calibrate("cpu", max_call_s=0.001, min_time_s=0.001)
>>> seconds = replay_seconds(tracer.trace, device, cache=False)
>>> bool((seconds > 0).all())
True
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch

from probe.simulator.clock import timer_for
from probe.simulator.devices import Device, cache_path
from probe.simulator.signature import TensorSpec, signature_key
from probe.simulator.trace import Trace

PASSES = 2


def replay_seconds(trace: Trace, device: Device, *, max_flops: float = 2e10,
                   max_bytes: float = 2**30, cache: bool = True) -> np.ndarray:
    """Seconds of each op of ``trace`` measured by replay (NaN where not replayed)."""
    if not trace.signatures:
        return np.full(trace.n_ops, np.nan)
    target = torch.device("cuda" if device.kind == "cuda" else "cpu")
    store = _Cache(device) if cache else None
    known = store.load() if store else {}
    sizes = _largest(trace)
    timer = timer_for(target, min_time_s=0.0015, samples=3)
    measured = np.full(len(trace.signatures), np.nan)
    todo: list[tuple[int, str]] = []
    for index, (func, args, kwargs) in enumerate(trace.signatures):
        key = signature_key((func, args, kwargs))
        flops, moved = sizes.get(index, (0, 0))
        if key in known:
            measured[index] = known[key]
        elif not (str(func).startswith("c10d.") or flops > max_flops or moved > max_bytes):
            todo.append((index, key))
    for _ in range(PASSES):
        for index, key in todo:
            func, args, kwargs = trace.signatures[index]
            try:
                real_args = _real(args, target)
                real_kwargs = {k: _real(v, target) for k, v in kwargs.items()}
                seconds = timer(lambda: func(*real_args, **real_kwargs))
            except (RuntimeError, ValueError, TypeError, IndexError):
                continue
            measured[index] = known[key] = min(known.get(key, seconds), seconds)
    if store:
        store.save(known)
    return measured[np.asarray(trace.op_signature, dtype=np.int64)]


def _largest(trace: Trace) -> dict[int, tuple[int, int]]:
    """(FLOPs, bytes) of each signature, from its ops."""
    out: dict[int, tuple[int, int]] = {}
    for sig, flops, moved in zip(trace.op_signature, trace.op_flops, trace.op_bytes):
        out.setdefault(sig, (flops, moved))
    return out


def _real(value: Any, device: torch.device) -> Any:
    """A real counterpart of a traced argument (see the module docstring)."""
    if isinstance(value, TensorSpec):
        if 0 in value.shape:
            return torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device=device)
        extent = value.offset + sum((n - 1) * s for n, s in zip(value.shape, value.stride)) + 1
        if value.dtype.is_floating_point:
            base = torch.rand(extent, device=device).add_(0.5).to(value.dtype)
        else:
            base = torch.zeros(extent, dtype=value.dtype, device=device)
        return base.as_strided(value.shape, value.stride, value.offset)
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, device) for v in value)
    return value


class _Cache:
    """Replayed op times of one calibration of one device, in the user cache folder."""

    def __init__(self, device: Device) -> None:
        self.path = cache_path().parent / "simulate-op-times.json"
        self.section = f"{device.name} | {device.source}"

    def load(self) -> dict[str, float]:
        try:
            return dict(json.loads(self.path.read_text(encoding="utf-8")).get(self.section, {}))
        except (OSError, ValueError):
            return {}

    def save(self, times: dict[str, float]) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        data = {k: v for k, v in data.items() if k.split(" | ")[0] != self.section.split(" | ")[0]}
        data[self.section] = times
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)
