"""Timing one call of a function: the fastest of several batches, on the device's clock.

Interference from other work on the machine only ever adds time, so the fastest batch is the
steadiest measure of the machine itself (as ``timeit`` advises).

On a CPU running one thread the clock is that thread's own CPU time (``time.thread_time``):
other processes on a shared machine do not count. Otherwise it is wall time, synchronised on
CUDA. Both the calibration and the validation's real runs use :func:`clock_name` to choose.

>>> timer = Timer(lambda: None, min_time_s=0.001, clock=time.perf_counter)
>>> 0 < timer(lambda: sum(range(100))) < 0.01
True
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def clock_name(device: torch.device) -> str:
    """``thread_cpu`` on a one-thread CPU, else ``wall``."""
    return "thread_cpu" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall"


def clock_for(name: str) -> Callable[[], float]:
    """The clock function called ``name``."""
    return time.thread_time if name == "thread_cpu" else time.perf_counter


def timer_for(device: torch.device, min_time_s: float, samples: int = 5) -> "Timer":
    """A :class:`Timer` on ``device``'s clock, synchronising CUDA."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return Timer(sync, min_time_s, clock_for(clock_name(device)), samples)


class Timer:
    """Seconds of one call of ``fn``: the fastest of ``samples`` batches, each lasting about
    ``min_time_s / samples`` (a warm-up call first)."""

    def __init__(self, sync: Callable[[], None], min_time_s: float,
                 clock: Callable[[], float], samples: int = 5) -> None:
        self.sync, self.min_time_s, self.clock, self.samples = sync, min_time_s, clock, samples

    def __call__(self, fn: Callable[[], object]) -> float:
        fn()
        self.sync()
        reps, found = 1, []
        while len(found) < self.samples:
            start = self.clock()
            for _ in range(reps):
                fn()
            self.sync()
            elapsed = self.clock() - start
            if elapsed < self.min_time_s / self.samples and reps < 1 << 16:
                reps *= 4
                continue
            found.append(elapsed / reps)
        return min(found)
