"""The node pairs of a compare result, as the diff graph reads them.

A compare's node rows (``CompareResult.nodes``, nodes.parquet; :mod:`probe.compare.result`) become
:class:`NodePair`: the two names, how they were matched, the node verdict, the precision score,
the reason, and whether a divergence starts at the pair or which origin it comes from. Any
table-like object will do (an Arrow table, a DataFrame, a list of mappings or dataclasses).

>>> p = node_pairs([{"node_a": "x", "node_b": "y", "match_method": "exact", "verdict": "error",
...                  "precision_score": 0.7, "origin": True}])[0]
>>> p.verdict, p.score, p.origin, p.direct
('error', 0.7, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["PROXY_METHODS", "NodePair", "node_pairs", "records", "as_mapping"]

#: Match methods that pair a node with a stand-in (its nearest matched ancestor, a container)
#: or with nothing, rather than with its own counterpart: the stand-in still syncs.
PROXY_METHODS = frozenset({"ancestor", "container", "unmatched"})


@dataclass
class NodePair:
    """One matched (or unmatched) node pair of a compare result."""

    node_a: str | None
    node_b: str | None
    match_method: str = ""
    verdict: str = ""
    score: float | None = None
    reason: str = ""
    order: int = 0
    band: str = "none"
    origin: bool = False                  # a divergence starts here
    affected_a: str | None = None         # an affected node: the origin it comes from, in A
    affected_b: str | None = None         # ... and in B

    @property
    def direct(self) -> bool:
        """Whether the pair is a node and its own counterpart (not a stand-in)."""
        return self.match_method not in PROXY_METHODS


def node_pairs(node_rows: list[dict[str, Any]], tensor_rows: list[dict[str, Any]] = ()) -> list[NodePair]:
    """The pairs of a compare's node rows (:func:`records` of them); of its tensor rows, one per
    pair of entries, when it has no node rows."""
    if not node_rows:
        seen: dict[tuple, dict] = {}
        for r in tensor_rows:
            seen.setdefault((r.get("node_a"), r.get("node_b")), r)
        node_rows = list(seen.values())
    pairs = []
    for i, r in enumerate(node_rows):
        order = _first(r, "order")
        pairs.append(NodePair(
            node_a=r.get("node_a") or None, node_b=r.get("node_b") or None,
            match_method=str(r.get("match_method") or ""), verdict=str(r.get("verdict") or ""),
            score=_float(_first(r, "score", "precision_score", "precision_index", "precision")),
            reason=str(r.get("reason") or ""), order=int(order if order is not None else i),
            origin=bool(r.get("origin")), affected_a=r.get("affected_by_a"),
            affected_b=r.get("affected_by_b")))
    return pairs


def records(obj: Any) -> list[dict[str, Any]]:
    """Rows of a table-like object (list of mappings, Arrow table, DataFrame, dataclasses)."""
    if obj is None:
        return []
    if hasattr(obj, "to_pylist"):
        return list(obj.to_pylist())
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):
        return list(obj.to_dict("records"))
    return [as_mapping(r) for r in obj]


def as_mapping(obj: Any) -> dict[str, Any]:
    """A mapping, named tuple, dataclass or plain object as a dict."""
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "_asdict"):
        return dict(obj._asdict())
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    return dict(vars(obj))


def _first(r: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if r.get(k) is not None:
            return r[k]
    return None


def _float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f
