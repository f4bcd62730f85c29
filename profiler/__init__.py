"""Profiler: ``mstx`` marks and ranges, profiling sessions, trace sinks, FLOPs and MFU/HFU.

``from probe.profiler import mstx`` is cheap (no torch); ``profile`` and ``Session`` load on first use.

>>> from probe.profiler import mstx, profile
"""

from __future__ import annotations

from typing import Any

from probe.profiler import mstx

__all__ = ["mstx", "profile", "Session"]


def __getattr__(name: str) -> Any:
    if name in ("profile", "Session"):
        from probe.profiler import session

        return getattr(session, name)
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
