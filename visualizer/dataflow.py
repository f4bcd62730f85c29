"""Data-flow edges of a dump: which node's output tensor is which node's input.

An edge is only drawn where the two ends are known to hold the same tensor:

1. **Identity of a tensor row.** The ``tensor_id`` column, where the dump recorded one (``probe
   dump`` does: the id it gave the data when it first read it in the step, from the tensor's
   memory, dtype, extent and version, shared by every row that saw the same unchanged bytes,
   views included; see :mod:`probe.dumper.rows`), is the identity. A row without one (msprobe's
   own dumps, older dumps, a tensor without storage) falls back on its statistics: dtype,
   element count, max, min, mean, L2 norm and hash, all equal, matched only with other rows
   without an id. A tensor whose statistics cannot tell it apart from another is given no
   identity: a constant one (max equal to min, as zeros, masks and ones are), an integer one
   without mean or norm, one whose statistics are not finite.
2. **Producers and consumers.** A node produces the data of its output rows and consumes that
   of its input and keyword rows. A module that hands on its child's output is no producer of
   its own, and a module whose child takes its input is no consumer of its own: the edge goes to
   the deepest node that touches the data (the hierarchy lifts it back to the module when the
   module is drawn collapsed).
3. **Matching.** A consumer is fed by the producer of the same data that finished last before
   the consumer started (an identity operation in between, such as ``view`` or ``contiguous``,
   produces the data again and so sits between its producer and its consumers). A node is never
   its own producer, nor its ancestor's or descendant's.

Execution order only picks among producers of the same data; it never makes an edge by itself.

>>> import pyarrow as pa
>>> from probe.collectors.records import table_from_rows
>>> row = dict(dtype="float32", shape=[2], max=2.0, min=-1.0, mean=0.5, l2norm=2.2)
>>> t = table_from_rows("tensor", [dict(row, node="a", slot="output", seq=0),
...                                dict(row, node="b", slot="input", seq=1)])
>>> flow_edges(t, {"a": None, "b": None})
[Edge(src='a', dst='b', via='statistics')]
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

#: The column a recorder writes its per-step tensor identity to (see the module docstring).
TENSOR_ID = "tensor_id"
PRODUCING = ("output",)
CONSUMING = ("input", "kwarg")


@dataclass(frozen=True)
class Edge:
    """Data flows from node ``src`` (an output) to node ``dst`` (an input); ``via`` says how the
    shared tensor was recognised: ``tensor_id`` (recorded by the dump) or ``statistics``."""

    src: str
    dst: str
    via: str


def _stat_identity(dtype, shape, mx, mn, mean, norm, digest) -> tuple | None:
    if dtype is None or mx is None or mn is None or (mean is None and norm is None and digest is None):
        return None
    if not (math.isfinite(mx) and math.isfinite(mn)) or mx == mn:
        return None
    numel = math.prod(shape) if shape is not None else None
    return (dtype, numel, mx, mn, mean, norm, digest)


#: how an identity was known, by its first element
_VIA = {"id": TENSOR_ID, "stats": "statistics"}


def _identities(tensors: pa.Table) -> list:
    """One identity (or None) per row: ``("id", tensor_id)`` where the row has a recorded id,
    else ``("stats", ...)`` from its statistics (see the module docstring)."""
    ids = tensors.column(TENSOR_ID).to_pylist() if TENSOR_ID in tensors.column_names else None
    if ids is not None and None not in ids:
        return [("id", v) for v in ids]
    cols = [tensors.column(c).to_pylist() for c in ("dtype", "shape", "max", "min", "mean", "l2norm", "hash")]
    if ids is None:
        return [_stat_key(v) for v in zip(*cols)]
    return [("id", i) if i is not None else _stat_key(v) for i, v in zip(ids, zip(*cols))]


def _stat_key(values: tuple) -> tuple | None:
    key = _stat_identity(*values)
    return None if key is None else ("stats", key)


def flow_edges(tensors: pa.Table, parent: Mapping[str, str | None]) -> list[Edge]:
    """The data-flow edges of one dump's tensor records (:data:`probe.collectors.records.TENSOR`,
    optionally with a ``tensor_id`` column), between the deepest nodes that touch each tensor
    (see the module docstring); ``parent`` maps every node to its parent (None at the top)."""
    if tensors.num_rows == 0:
        return []
    ids = _identities(tensors)
    nodes = tensors.column("node").to_pylist()
    slots = tensors.column("slot").to_pylist()
    seqs = tensors.column("seq").to_pylist()
    end: dict[str, int] = {}
    for i, (n, s) in enumerate(zip(nodes, seqs)):
        end.setdefault(n, i if s is None else s)
    start = dict(end)
    for n, t in end.items():
        p, seen = parent.get(n), {n}
        while p is not None and p not in seen:
            seen.add(p)
            if t < start.get(p, math.inf):
                start[p] = t
            p = parent.get(p)
    producers: dict[tuple, set[str]] = {}
    consumers: dict[tuple, set[str]] = {}
    for key, n, slot in zip(ids, nodes, slots):
        if key is None:
            continue
        if slot in PRODUCING:
            producers.setdefault(key, set()).add(n)
        elif slot in CONSUMING:
            consumers.setdefault(key, set()).add(n)
    edges: dict[tuple[str, str], Edge] = {}
    for key, users in consumers.items():
        makers = producers.get(key)
        if not makers:
            continue
        made = sorted((end[p], p) for p in _deepest(makers, parent))
        times = [t for t, _ in made]
        for c in _deepest(users, parent):
            i = bisect_right(times, start[c])
            while i > 0:
                i -= 1
                p = made[i][1]
                if p != c and not _related(p, c, parent):
                    edges.setdefault((p, c), Edge(p, c, _VIA[key[0]]))
                    break
    return sorted(edges.values(), key=lambda e: (start[e.dst], end[e.src], e.src, e.dst))


def _related(a: str, b: str, parent: Mapping[str, str | None]) -> bool:
    """Whether ``a`` is ``b``, its ancestor or its descendant."""
    for x, y in ((a, b), (b, a)):
        p, seen = x, set()
        while p is not None and p not in seen:
            if p == y:
                return True
            seen.add(p)
            p = parent.get(p)
    return False


def _deepest(nodes: set[str], parent: Mapping[str, str | None]) -> list[str]:
    """The nodes of ``nodes`` with no descendant in ``nodes`` (the deepest that touch the data)."""
    if len(nodes) == 1:
        return list(nodes)
    covered: set[str] = set()
    for n in nodes:
        p, seen = parent.get(n), {n}
        while p is not None and p not in seen:
            seen.add(p)
            covered.add(p)
            p = parent.get(p)
    return [n for n in nodes if n not in covered]
