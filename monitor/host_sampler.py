"""Host CPU and memory of a rank, sampled with psutil for the agent's batches.

CPU percentages are over the time since the previous sample, so the first call only primes
the counters and returns nothing.

>>> sampler = HostSampler()
>>> sampler.sample()
{}
>>> sorted(sampler.sample())
['host_cpu_percent', 'host_mem_percent', 'proc_cpu_percent', 'proc_rss_mb']
"""

from __future__ import annotations

from typing import Any


class HostSampler:
    """Samples the host's and this process's CPU and memory; see the module docstring."""

    def __init__(self) -> None:
        self._proc: Any = None

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
