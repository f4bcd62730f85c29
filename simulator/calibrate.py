"""Measure this machine for the time model: ``probe simulate --calibrate``.

Three curves, each the fastest time of batches of calls at growing sizes (:mod:`probe.simulator.clock`),
each size timed twice, a sweep apart (the faster kept), on the threads torch uses
now (the CPU) or on the current CUDA device, and one figure from a real training loop:

1. ``matmul``: ``torch.mm`` of square matrices per dtype, as (FLOPs, seconds) points;
2. ``memory``: ``x + y`` (two reads, one write, one fresh output, as most ops do), as
   (bytes moved, seconds) points;
3. ``view_s``: a metadata-only op (``x.view(-1)``), the cost of an op that moves nothing;
4. ``op_overhead_s``: what an eager training loop spends beyond the ops themselves (Python,
   module calls, autograd bookkeeping, the optimizer's loop), per op of each phase and per
   module call (:mod:`probe.simulator.overhead`).

Sizes grow until one call takes longer than ``max_call_s``. On a CPU with one thread the clock
is the thread's own CPU time (``time.thread_time``), so other work on a shared machine does
not count; otherwise wall time (synchronised on CUDA). The result is a
:class:`~probe.simulator.devices.Device` whose peak FLOP/s and bandwidth are the best measured, saved
in the user cache (:func:`probe.simulator.devices.save_calibrated`) by the command.

>>> dev = calibrate("cpu", max_call_s=0.002, min_time_s=0.002)
>>> dev.name, dev.source.startswith("calibrated"), len(dev.curves["memory"]) > 2
('cpu', True, True)
"""

from __future__ import annotations

import datetime
import os
import platform
import torch

from probe.ground.errors import ProbeError
from probe.simulator.clock import clock_name, timer_for
from probe.simulator.devices import Device
from probe.simulator.overhead import measure_overhead

MATMUL_SIZES = (8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192)
ELEMENTS = tuple(4 ** k for k in range(2, 14))          # 16 .. 64M elements


def calibrate(device: str = "cpu", *, max_call_s: float = 0.05, min_time_s: float = 0.02) -> Device:
    """Measure ``device`` (``cpu`` or ``cuda``); see the module docstring."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ProbeError(f"--calibrate on {device}: CUDA is not available on this machine")
    dev = torch.device(device)
    timer = timer_for(dev, min_time_s)
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if dev.type == "cuda" else [])
    matmul = {str(dtype).replace("torch.", ""): _sweep(timer, max_call_s, MATMUL_SIZES, _matmul(dev, dtype),
                                                     lambda n: 2.0 * n ** 3)
              for dtype in dtypes}
    memory = _sweep(timer, max_call_s, ELEMENTS, _add(dev), lambda n: 3.0 * 4 * n)
    x = torch.randn(16, device=dev)
    view_s = timer(lambda: x.view(-1))
    curves = {"matmul": matmul, "memory": memory, "view_s": view_s, "clock": clock_name(dev),
              "threads": torch.get_num_threads() if dev.type == "cpu" else None}
    curves["op_overhead_s"] = measure_overhead(dev, curves, timer.clock)
    return _device(dev, curves)


def _sweep(timer, max_call_s: float, sizes: tuple[int, ...], make, work) -> list[list[float]]:
    """(work, seconds) at growing sizes until one call takes ``max_call_s``; then the same sizes
    again, each point the faster of its two (a slow stretch of a shared machine seldom falls on
    both)."""
    points: list[list[float]] = []
    for n in sizes:
        points.append([work(n), timer(make(n))])
        if points[-1][1] > max_call_s:
            break
    for point, n in zip(points, sizes):
        point[1] = min(point[1], timer(make(n)))
    return points


def _matmul(dev: torch.device, dtype: torch.dtype):
    def make(n: int):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        return lambda: torch.mm(a, b)
    return make


def _add(dev: torch.device):
    def make(n: int):
        x = torch.randn(n, device=dev)
        y = torch.randn(n, device=dev)
        return lambda: x + y
    return make


def _device(dev: torch.device, curves: dict) -> Device:
    peaks = {dtype: max(f / s for f, s in points) for dtype, points in curves["matmul"].items()}
    bandwidth = max(b / s for b, s in curves["memory"])
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name, memory = props.name, props.total_memory
        where = f"{name}, calibrated {stamp}"
    else:
        import psutil

        name, memory = "cpu", psutil.virtual_memory().total
        where = f"calibrated {stamp} on {platform.node()} with {curves['threads']} threads"
    return Device(name=name, kind=dev.type, memory_bytes=int(memory), peak_flops=peaks,
                  memory_bw=bandwidth, link_intra_bw=bandwidth, link_inter_bw=bandwidth,
                  ranks_per_node=os.cpu_count() or 1, link_latency_s=curves["memory"][0][1],
                  launch_s=curves["memory"][0][1],
                  source=where if where.startswith("calibrated") else f"calibrated: {where}",
                  curves=curves)
