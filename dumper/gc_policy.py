"""How the cyclic garbage collector runs while a dump records.

A dump keeps a step's entries, rows and statistics handles alive until the step is written:
thousands of small container objects a step at module level, tens of thousands at mix level.
Under CPython's default thresholds those allocations trigger young collections every few
hundred objects and, every few steps, a full collection that walks the whole heap; a training
process with torch imported holds some 300,000 tracked objects, and a full pass over them
costs about 200 ms on the 2-core reference machine (measured on the ``mini`` preset at mix
level: 30 ms a step on average, more than half of the dump's added time).

:class:`GcPolicy` changes two things for the length of a dump and restores both at its end:

- the objects that exist when the dump starts (the model, the imported libraries) are moved
  to the permanent generation with :func:`gc.freeze` (only when nothing else froze them), so a
  full collection walks only what was created since;
- young collections run every :data:`YOUNG_THRESHOLD` allocations instead of 700, so the
  dump's short-lived bookkeeping is mostly freed by reference counting before a collection
  ever walks it.

Garbage cycles are still collected during the dump, only later; a cycle among objects that
existed before the dump and became unreachable during it waits until the dump ends. When the
program disabled the collector, or ``PROBE_DUMP_GC=default`` is set, nothing is changed.

>>> import gc
>>> before = gc.get_threshold()
>>> p = GcPolicy().start()
>>> gc.get_threshold()[0] >= YOUNG_THRESHOLD or not gc.isenabled()
True
>>> p.stop(); gc.get_threshold() == before
True
"""

from __future__ import annotations

import gc
import os

#: allocations between two young collections while a dump records (CPython's default is 700)
YOUNG_THRESHOLD = 20_000


class GcPolicy:
    """Freeze the heap and space out young collections between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self._saved: tuple[int, ...] | None = None
        self._froze = False

    def start(self) -> "GcPolicy":
        if self._saved is not None or not gc.isenabled() or os.environ.get("PROBE_DUMP_GC") == "default":
            return self
        self._saved = gc.get_threshold()
        if gc.get_freeze_count() == 0:
            gc.freeze()
            self._froze = True
        young, *older = self._saved
        gc.set_threshold(max(young, YOUNG_THRESHOLD), *older)
        return self

    def stop(self) -> None:
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        self._saved = None
        if self._froze:
            self._froze = False
            gc.unfreeze()
