"""Finding nodes in a diff graph: the first divergence, the first NaN, filters, search, what to
expand to show a node, and the chains a UI highlights.

Every function takes a :class:`probe.visualizer.diff.DiffGraph` and returns ``(side, node)`` pairs or
node names, in execution order where there are several.

- :func:`first_divergence`: the compare summary's (none when it found none), else (a diff
  without a compare) the first node whose precision band is ``error`` with no ``error`` inside it;
- :func:`first_nan`: the summary's (none when it found none), else the first node graded ``nan``
  (NaN/Inf on one side only), else, for one dump alone, the innermost first node holding NaN/Inf;
- :func:`filter_nodes` and :func:`search`: the filter list and the search hits;
- :func:`reveal`: the ancestors to expand on both sides so that a node and its counterpart show;
- :func:`root_path`: the chain from the top of the hierarchy down to a node;
- :func:`flow_path`: the chain of data-flow edges from one node to another (how an error reaches
  a NaN), shortest first.

>>> d = DiffGraph.from_dumps("A", "B")                                  # doctest: +SKIP
>>> side, node = first_divergence(d)                                    # doctest: +SKIP
>>> root_path(d, side, node)                                            # doctest: +SKIP
['Module.layers.1.Block.forward.0', 'Module.layers.1.mlp.MLP.forward.0', 'Module.layers.1.mlp.down_proj...']
"""

from __future__ import annotations

from collections import deque
from functools import wraps
from typing import Any, Callable, Iterable, Mapping

from probe.visualizer import bands as B
from probe.visualizer.diff import SIDES, DiffGraph, other_side
from probe.visualizer.search import find


def _once(fn: Callable) -> Callable:
    """Keep a function's answer for a diff (and arguments) in the diff (:attr:`DiffGraph.found`)."""
    @wraps(fn)
    def kept(diff: DiffGraph, *args: Any) -> Any:
        key = (fn.__name__, *args)
        if key not in diff.found:
            diff.found[key] = fn(diff, *args)
        return diff.found[key]
    return kept


@_once
def first_divergence(diff: DiffGraph) -> tuple[str, str] | None:
    """(side, node) where numerics first go wrong: the compare summary's, else the first node
    in execution order whose band is ``error`` with no ``error`` below it."""
    if not diff.paired:
        return None
    named = _summary_node(diff, "first_divergence")
    if named or _summary_says_none(diff, "first_divergence"):
        return named
    for side, n in diff.in_order():
        if side == "a" and diff.band(side, n) == B.ERROR and diff.worst_below(side, n) != B.ERROR:
            return side, n
    return None


@_once
def first_nan(diff: DiffGraph) -> tuple[str, str] | None:
    """(side, node) of the first node in execution order with a NaN/Inf statistic and no child
    holding one; in a pair, first one whose verdict is ``nan`` (NaN/Inf on one side only: an
    attention mask's -inf on both sides is no fault), on the side that holds it."""
    named = _summary_node(diff, "first_nan")
    if named or _summary_says_none(diff, "first_nan"):
        return named
    if diff.paired:
        for side, n in diff.in_order():
            g = diff.graph(side)
            if diff.state(side, n) == B.NAN and not any(diff.state(side, k) == B.NAN for k in g.children(n)):
                twin = diff.counterpart(side, n)
                if diff.nonfinite(side, n) or not twin:
                    return side, n
                return other_side(side), twin
        return None             # in a pair, NaN/Inf held alike on both sides is no origin
    g = diff.graph("a")
    for n in g.walk():
        if g.nonfinite(n) and not any(g.nonfinite(k) for k in g.children(n)):
            return "a", n
    return None


def _summary_says_none(diff: DiffGraph, key: str) -> bool:
    """Whether the compare summary the diff carries found no such node (its answer is the one
    the CLI and summary.json give: the page shows the same)."""
    return diff.paired and key in diff.summary and diff.summary[key] is None


def _summary_node(diff: DiffGraph, key: str) -> tuple[str, str] | None:
    v = diff.summary.get(key)
    if isinstance(v, Mapping):
        named = [("a", v.get("a") or v.get("node_a")), ("b", v.get("b") or v.get("node_b"))]
    elif isinstance(v, (list, tuple)) and v:
        named = [("a", v[0]), ("b", v[1] if len(v) > 1 else v[0])]
    else:
        named = [("a", v), ("b", v)]
    for side, name in named:
        g = diff.graphs[side]
        if name and g is not None and name in g:
            return side, str(name)
    return None


def filter_nodes(diff: DiffGraph, kinds: Iterable[str]) -> list[tuple[str, str]]:
    """Nodes in execution order whose state is in ``kinds`` (error, warning, unmatched, nan); a
    ``nan`` node is listed on the side that holds the NaN/Inf."""
    kinds = set(kinds)
    out = []
    for side, n in diff.in_order():
        st = diff.state(side, n)
        if st not in kinds:
            continue
        twin = diff.counterpart(side, n)
        if st == B.NAN and not diff.nonfinite(side, n) and twin and diff.nonfinite(other_side(side), twin):
            out.append((other_side(side), twin))
        else:
            out.append((side, n))
    return out


def search(diff: DiffGraph, query: str) -> list[tuple[str, str]]:
    """Nodes whose name or label matches ``query`` (fuzzy, case-insensitive), execution order."""
    keys = diff.search_keys()
    return [keys[t] for t in find(query, keys)]


def reveal(diff: DiffGraph, side: str, name: str) -> dict[str, list[str]]:
    """The nodes to expand on each side so that ``name`` and its counterpart are visible."""
    other = other_side(side)
    out = {side: diff.graph(side).ancestors(name), other: []}
    twin = diff.counterpart(side, name)
    if twin and twin in (diff.graphs[other] or ()):
        out[other] = diff.graph(other).ancestors(twin)
    return out


def root_path(diff: DiffGraph, side: str, name: str) -> list[str]:
    """The chain from the top of the hierarchy down to ``name`` (its ancestors, then itself)."""
    return diff.graph(side).ancestors(name) + [name]


@_once
def flow_path(diff: DiffGraph, side: str, src: str, dst: str) -> list[str]:
    """The shortest chain of data-flow edges on ``side`` from ``src`` (or a node inside it) to
    ``dst`` (or a node inside it), as the nodes it passes; empty when no edge leads there."""
    g = diff.graph(side)
    succ: dict[str, list[str]] = {}
    for e in g.flow():
        succ.setdefault(e.src, []).append(e.dst)
    starts = [n for n in succ if g.within(n, src)]
    came: dict[str, str | None] = {n: None for n in starts}
    todo = deque(starts)
    while todo:
        n = todo.popleft()
        if g.within(n, dst):
            chain = [n]
            while came[chain[-1]] is not None:
                chain.append(came[chain[-1]])
            return chain[::-1]
        for m in succ.get(n, ()):
            if m not in came:
                came[m] = n
                todo.append(m)
    return []
