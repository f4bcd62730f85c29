"""probe: dump, compare, profile and monitor deep-learning training; the one import root.

The public Python API, each name loaded on first use (importing ``probe`` imports no torch):

- ``probe.dump(model, out=..., level=...)`` (a context manager), ``probe.start``,
  ``probe.step``, ``probe.stop``: record a model's steps (:mod:`probe.dumper.session`);
- ``probe.flight_recorder(model, steps=K, out=...)``: the last K steps' per-module statistics
  kept in memory, written as a dump when the loss or gradients turn NaN/Inf or spike
  (:mod:`probe.dumper.flight`);
- ``probe.mstx``: ``mark``, ``range``, ``range_start``, ``range_end`` (:mod:`probe.profiler.mstx`);
- ``probe.compare(a, b)``: compare two dumps (:func:`probe.compare.api.compare`);
- ``probe.open_store(run)``: a DuckDB connection over a run's records
  (:func:`probe.collectors.store.open_store`).

Every room of the project lives under this root (``probe.compare``, ``probe.monitor``, ...).

>>> import probe
>>> callable(probe.start), callable(probe.dump), callable(probe.compare), callable(probe.mstx.mark)
(True, True, True, True)
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> (module, attribute of it, or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "start": ("probe.dumper.session", "start"), "stop": ("probe.dumper.session", "stop"),
    "step": ("probe.dumper.session", "step"), "dump": ("probe.dumper.session", "dump"),
    "DumpSession": ("probe.dumper.session", "DumpSession"),
    "flight_recorder": ("probe.dumper.flight", "flight_recorder"),
    "mstx": ("probe.profiler.mstx", None),
    "compare": ("probe.compare", None),
    "open_store": ("probe.collectors.store", "open_store"),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    module = importlib.import_module(where[0])
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value              # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
