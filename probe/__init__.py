"""probe: the dump API (``probe.start/stop/step``, a context manager) and the ``probe`` command.

Importing ``probe`` is cheap: the dump machinery loads on first use.

>>> import probe
>>> callable(probe.start), callable(probe.dump)
(True, True)
"""

from __future__ import annotations

from typing import Any

_LAZY = {"start": "probe.dumper.session", "stop": "probe.dumper.session", "step": "probe.dumper.session",
         "dump": "probe.dumper.session", "DumpSession": "probe.dumper.session"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    import importlib
    loaded = importlib.import_module(module)
    # bind every name the loaded module provides, so later lookups skip this hook
    for lazy, where in _LAZY.items():
        if where == module:
            globals()[lazy] = getattr(loaded, lazy)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
