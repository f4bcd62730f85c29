"""Host CPU and memory of a rank, sampled with psutil for the agent's batches.

CPU percentages are over the time since the previous sample, so the first call only primes
the counters and returns nothing. :meth:`HostSampler.sample_at` samples at most once every
``interval_s``, and only for a step newer than the last one sampled (the call that primes
takes neither the step nor the time).

>>> sampler = HostSampler(interval_s=0)
>>> sampler.sample_at(0) is None                      # primes the counters
True
>>> sorted(sampler.sample_at(0))
['host_cpu_percent', 'host_mem_percent', 'proc_cpu_percent', 'proc_rss_mb']
>>> sampler.sample_at(0) is None                      # step 0 has its sample
True
"""

from __future__ import annotations

import time
from typing import Any


class HostSampler:
    """Samples the host's and this process's CPU and memory; see the module docstring."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._proc: Any = None
        self._last_step = -1
        self._last_time = 0.0

    def sample(self) -> dict[str, float]:
        """The metrics since the last call (``{}`` on the first); ImportError without psutil."""
        import psutil

        if self._proc is None:
            self._proc = psutil.Process()
            self._proc.cpu_percent(None)
            psutil.cpu_percent(None)
            return {}
        mem = self._proc.memory_info()
        return {"host_cpu_percent": psutil.cpu_percent(None),
                "host_mem_percent": psutil.virtual_memory().percent,
                "proc_cpu_percent": self._proc.cpu_percent(None),
                "proc_rss_mb": mem.rss / 2**20}

    def sample_at(self, step: int) -> dict[str, float] | None:
        """The metrics for ``step`` when a sample is due, else None."""
        if step <= self._last_step or time.monotonic() - self._last_time < self.interval_s:
            return None
        if self._proc is None:
            self.sample()
            return None
        self._last_step, self._last_time = step, time.monotonic()
        return self.sample()
