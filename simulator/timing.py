"""How long each traced op takes on a device, and the compute time of a step by phase.

An op's time, for a device with measured curves (:mod:`probe.simulator.calibrate`):

- an op with FLOPs (matmuls, attention: :mod:`probe.profiler.flops`' formulas): the ``matmul`` curve
  of its dtype (float32's when that dtype was not measured) at its FLOPs;
- an op that moves no bytes (views, metadata): ``view_s``;
- any other op: the ``memory`` curve at the bytes it reads and writes;
- every op, in addition: ``op_overhead_s`` of its phase and of the module calls entered just
  before it, what the eager loop spends around it (:mod:`probe.simulator.overhead`).

Curves are read in log-log between measured points; below the first point an op takes the
first point's time (the fixed cost of an op), above the last it goes at the last point's rate.

Where an op was replayed for real (:mod:`probe.simulator.replay`), its measured time replaces the
curve's.

For a datasheet device, the roofline: the longer of FLOPs at the dtype's peak and bytes at the
HBM bandwidth, at least one launch; views cost nothing (they never reach the device).
Collective ops in the trace (``c10d.*``) cost nothing here: :mod:`probe.simulator.collectives` times
them from their sizes.

>>> import numpy as np
>>> from probe.simulator.devices import get_device
>>> from probe.simulator.trace import Trace
>>> t = Trace(op_name=["aten.mm.default", "aten.view.default"], op_flops=[2 * 4096 ** 3, 0],
...           op_bytes=[3 * 2 * 4096 ** 2, 0], op_dtype=["bfloat16", "bfloat16"])
>>> seconds = op_seconds(t, get_device("H100"))
>>> round(seconds[0] * 1e6), float(seconds[1])
(139, 0.0)
"""

from __future__ import annotations

import numpy as np

from probe.simulator.devices import Device
from probe.simulator.trace import PHASES, Trace


def op_seconds(trace: Trace, device: Device, measured: np.ndarray | None = None) -> np.ndarray:
    """Seconds of each op of ``trace`` on ``device`` (NaN where the device has no peak for the
    op's dtype); see the module docstring. ``measured``: replayed times
    (:mod:`probe.simulator.replay`) used instead of the curves where they are not NaN."""
    flops = np.asarray(trace.op_flops, dtype=np.float64)
    moved = np.asarray(trace.op_bytes, dtype=np.float64)
    dtypes = np.asarray(trace.op_dtype, dtype=object)
    comm = np.fromiter((name.startswith("c10d.") for name in trace.op_name), dtype=bool,
                       count=len(trace.op_name))
    if device.curves:
        loop = device.curves["op_overhead_s"]
        overhead = np.asarray([loop.get(PHASES[p], 0.0) for p in range(4)])
        overhead = overhead[np.asarray(trace.op_phase, dtype=np.int64)]
        if trace.op_calls:
            overhead = overhead + loop.get("module_call", 0.0) * np.asarray(trace.op_calls)
        seconds = _measured(flops, moved, dtypes, device.curves)
        if measured is not None:
            seconds = np.where(np.isnan(measured), seconds, measured)
        seconds = seconds + overhead
    else:
        seconds = _roofline(flops, moved, dtypes, device)
    seconds[comm] = 0.0
    return seconds


def _measured(flops: np.ndarray, moved: np.ndarray, dtypes: np.ndarray, curves: dict) -> np.ndarray:
    seconds = np.where(moved > 0, _read_curve(curves["memory"], moved), curves["view_s"])
    for dtype in set(dtypes[flops > 0].tolist()):
        points = curves["matmul"].get(dtype) or curves["matmul"]["float32"]
        mask = (flops > 0) & (dtypes == dtype)
        seconds[mask] = _read_curve(points, flops[mask])
    return seconds


def _roofline(flops: np.ndarray, moved: np.ndarray, dtypes: np.ndarray, device: Device) -> np.ndarray:
    peak = np.array([device.peak(d) or np.nan for d in dtypes.tolist()], dtype=np.float64)
    compute = np.where(flops > 0, flops / peak, 0.0)
    kernel = np.maximum(compute, moved / device.memory_bw)
    return np.where((flops > 0) | (moved > 0), np.maximum(kernel, device.launch_s), 0.0)


def _read_curve(points: list[list[float]], x: np.ndarray) -> np.ndarray:
    """Seconds at sizes ``x`` from measured (size, seconds) points (see the module docstring)."""
    xs = np.array([p[0] for p in points], dtype=np.float64)
    ts = np.array([p[1] for p in points], dtype=np.float64)
    inside = np.exp(np.interp(np.log(np.maximum(x, xs[0])), np.log(xs), np.log(ts)))
    return np.where(x > xs[-1], ts[-1] * x / xs[-1], inside)


def phase_seconds(trace: Trace, seconds: np.ndarray, step: int) -> dict[str, float]:
    """Seconds of the ops of optimizer step ``step`` (0-based), summed by phase."""
    steps = np.asarray(trace.op_step)
    phases = np.asarray(trace.op_phase)
    mask = steps == step
    return {name: float(np.nansum(seconds[mask & (phases == i)])) for i, name in enumerate(PHASES)}


def step_flops(trace: Trace, step: int) -> tuple[int, int]:
    """(model, hardware) FLOPs of optimizer step ``step``."""
    mask = np.asarray(trace.op_step) == step
    return (int(np.asarray(trace.op_model_flops, dtype=np.int64)[mask].sum()),
            int(np.asarray(trace.op_flops, dtype=np.int64)[mask].sum()))
