"""Memory over a traced run: live bytes per category after every op, the peak, and who holds it.

From a :class:`~probe.simulator.trace.Trace`:

1. each storage adds its bytes to its category from the op that made it and takes them away at
   the op count when it died (never died: kept to the end);
2. a cumulative sum over ops gives ``live[category, op]``, the bytes live after each op;
3. the peak is the op with the most live bytes in all (scaled per category for a sharded rank,
   plus any extra series, as :mod:`probe.simulator.ranks` asks);
4. the holders at the peak are the storages live then, summed by (module, category).

>>> import torch
>>> from probe.simulator.trace import OpTracer
>>> with OpTracer() as tracer:
...     a = torch.ones(1024)            # 4 KiB, kept
...     b = a * 2                       # 4 KiB, dies at once
...     del b
...     c = a + 1
>>> tl = timeline(tracer.trace)
>>> tl.peak, tl.total.tolist()
(8192, [4096, 8192, 8192])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from probe.simulator.trace import CATEGORIES, Trace


@dataclass
class Timeline:
    """``live[c, k]``: bytes of category ``CATEGORIES[c]`` live after op ``k``."""

    live: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.live.sum(axis=0)

    @property
    def peak(self) -> int:
        return int(self.total.max()) if self.live.shape[1] else 0

    @property
    def peak_index(self) -> int:
        return int(self.total.argmax()) if self.live.shape[1] else 0

    def maxima(self) -> dict[str, int]:
        """The largest bytes each category reaches (each at its own moment)."""
        return {name: int(self.live[i].max()) if self.live.shape[1] else 0
                for i, name in enumerate(CATEGORIES)}

    def at(self, index: int) -> dict[str, int]:
        """Bytes of each category live after op ``index``."""
        return {name: int(self.live[i, index]) for i, name in enumerate(CATEGORIES)}

    def scaled(self, factors: dict[str, float], extra: np.ndarray | None = None) -> np.ndarray:
        """Total live bytes after each op with each category times its factor, plus ``extra``."""
        weights = np.array([factors.get(name, 1.0) for name in CATEGORIES])[:, None]
        total = (self.live * weights).sum(axis=0)
        return total + extra if extra is not None else total


def storage_arrays(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(bytes, alloc, free, category)`` per storage; ``free`` is ``n_ops`` for the living."""
    nbytes = np.asarray(trace.storage_bytes, dtype=np.int64)
    alloc = np.asarray(trace.storage_alloc, dtype=np.int64)
    free = np.asarray(trace.storage_free, dtype=np.int64)
    free = np.where(free < 0, trace.n_ops, free)
    category = np.fromiter((trace.category(k) for k in range(len(nbytes))), dtype=np.int64,
                           count=len(nbytes))
    return nbytes, alloc, free, category


def timeline(trace: Trace) -> Timeline:
    """The live-bytes timeline of ``trace`` (see the module docstring)."""
    n = trace.n_ops
    nbytes, alloc, free, category = storage_arrays(trace)
    delta = np.zeros((len(CATEGORIES), n + 1), dtype=np.int64)
    np.add.at(delta, (category, np.minimum(alloc, n)), nbytes)
    np.add.at(delta, (category, free), -nbytes)
    return Timeline(np.cumsum(delta, axis=1)[:, :n])


def holders(trace: Trace, index: int, top: int = 10) -> list[dict]:
    """The storages live after op ``index``, summed by (module, category), largest first."""
    nbytes, alloc, free, category = storage_arrays(trace)
    live = (alloc <= index) & (free > index)
    module = np.asarray(trace.storage_module, dtype=np.int64)
    groups: dict[tuple[int, int], int] = {}
    for m, c, b in zip(module[live].tolist(), category[live].tolist(), nbytes[live].tolist()):
        groups[(m, c)] = groups.get((m, c), 0) + b
    rows = sorted(groups.items(), key=lambda kv: -kv[1])[:top]
    return [{"module": trace.modules[m], "category": CATEGORIES[c], "bytes": b} for (m, c), b in rows]
