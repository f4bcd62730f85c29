"""The diff graph: two hierarchy graphs, their matched node pairs, states, search and filters.

Built from a compare result (``compare.api.compare`` or ``compare.api.load_result``), or from one
dump alone (no pairs; NaN/Inf still found). A node's state, its colour, is its own verdict in
the compare (:mod:`compare.verdict`); whether its divergence starts there or comes from upstream
(:func:`compare.localise.with_impact`) is told apart by :meth:`DiffGraph.impact`. A compare
result of other dumps than the ones given is refused (:attr:`DiffGraph.refusal`). Everything
is computed when first asked for: states of the nodes on screen, the worst state below a
collapsed node, the filter list.

>>> from visualizer.graph import Graph
>>> g = Graph.load("/work/shared/data/msprobe/torch_L0")                      # doctest: +SKIP
>>> d = DiffGraph(g)                                                           # doctest: +SKIP
>>> d.band("a", g.roots()[0])                                                  # doctest: +SKIP
'none'
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ground.errors import ProbeError
from visualizer import bands as B
from visualizer.graph import Graph, TensorStat, dump_source, load_graph
from visualizer.pairs import PROXY_METHODS, NodePair, as_mapping, node_pairs, records
from visualizer.search import find

SIDES = ("a", "b")
#: What the filter list can show.
FILTERS = ("error", "warning", "unmatched", "nan")
#: States a compare verdict can give a node.
STATES = frozenset({B.PASS, B.WARNING, B.ERROR, B.NAN, B.UNMATCHED})


@dataclass
class Detail:
    """What the detail panel shows for a selected node."""

    node_a: str | None
    node_b: str | None
    state: str
    score: float | None
    match_method: str
    reason: str
    impact: str = ""                      # origin | affected | ""
    affected_by: tuple[str, str] | None = None
    tensors_a: list[TensorStat] = field(default_factory=list)
    tensors_b: list[TensorStat] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    stack_a: list[str] = field(default_factory=list)
    stack_b: list[str] = field(default_factory=list)
    nonfinite: bool = False


def _other(side: str) -> str:
    return "b" if side == "a" else "a"


class DiffGraph:
    """Side ``a`` (and optionally side ``b``) with matched pairs, states, search and filters."""

    def __init__(self, graph_a: Graph, graph_b: Graph | None = None,
                 pairs: Iterable[NodePair] = (), summary: Mapping[str, Any] | None = None,
                 rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self.graphs: dict[str, Graph | None] = {"a": graph_a, "b": graph_b}
        self.summary: dict[str, Any] = dict(summary or {})
        #: why the compare result given was refused (it belongs to other dumps), else None
        self.refusal: str | None = None
        self.pairs = list(pairs)
        self._pair: dict[str, dict[str, NodePair]] = {"a": {}, "b": {}}
        for p in self.pairs:
            for side, name, g in (("a", p.node_a, graph_a), ("b", p.node_b, graph_b)):
                if name and g is not None and name in g:
                    held = self._pair[side].get(name)
                    if held is None or p.direct > held.direct:
                        self._pair[side][name] = p
        self._rows = list(rows)
        self._rows_by: dict[tuple[str | None, str | None], list[dict]] | None = None
        self._worst: dict[str, dict[str, str]] = {"a": {}, "b": {}}
        self._band: dict[str, dict[str, str]] = {"a": {}, "b": {}}
        self._state: dict[str, dict[str, str]] = {"a": {}, "b": {}}
        self._search_keys: dict[str, tuple[str, str]] | None = None
        self._warm = threading.Event()
        self._warm_lock = threading.Lock()
        self._order: list[tuple[str, str]] | None = None

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_result(cls, result: Any, dump_a: str | os.PathLike | Graph,
                    dump_b: str | os.PathLike | Graph) -> "DiffGraph":
        """From a compare result (``.nodes``, ``.rows``, ``.summary``) and the two dumps."""
        ga, gb = load_graph(dump_a), load_graph(dump_b)
        tensor_rows = records(getattr(result, "rows", None))
        pairs = node_pairs(records(getattr(result, "nodes", None)), tensor_rows)
        return cls(ga, gb, pairs, as_mapping(getattr(result, "summary", None)), tensor_rows)

    @classmethod
    def refused(cls, message: str) -> "DiffGraph":
        """A diff that holds nothing but why it was refused (:attr:`refusal`)."""
        from collectors.records import NODE, TENSOR

        diff = cls(Graph(TENSOR.empty_table(), NODE.empty_table()))
        diff.refusal = message
        return diff

    @classmethod
    def from_dumps(cls, dump_a: str | os.PathLike | None, dump_b: str | os.PathLike | None = None,
                   compare_dir: str | os.PathLike | None = None,
                   mapping: str | os.PathLike | None = None) -> "DiffGraph":
        """One dump; two dumps compared now with ``compare.api.compare``; or the result written
        by ``probe compare --out compare_dir`` (its dumps found from its summary when not given),
        refused (:meth:`refused`) when its inputs' fingerprints are not those of the dumps."""
        if compare_dir is None:
            if dump_a is None:
                raise ProbeError("give a dump (--dump A [B]) or a compare result (--compare DIR)")
            if dump_b is None:
                return cls(load_graph(dump_a))
        try:
            from compare import api
        except ImportError as e:
            raise ProbeError(f"compare is not available ({e}); open one dump at a time") from None
        if compare_dir is None:
            return cls.from_result(api.compare(str(dump_a), str(dump_b), mapping=mapping), dump_a, dump_b)
        result = api.load_result(compare_dir)
        summary = as_mapping(getattr(result, "summary", None))
        dump_a = dump_a if dump_a is not None else summary.get("a")
        dump_b = dump_b if dump_b is not None else summary.get("b")
        if not dump_a or not dump_b:
            raise ProbeError(f"{compare_dir}: the result does not name its dumps; give them too (--dump A B)")
        from compare.fingerprint import foreign_input

        why = foreign_input(summary, {"a": dump_source(dump_a), "b": dump_source(dump_b)})
        if why:
            return cls.refused(f"{compare_dir}: this compare result belongs to other dumps: {why}. "
                               f"Compare these dumps (probe compare {dump_a} {dump_b} --out DIR) "
                               "and open that result.")
        diff = cls.from_result(result, dump_a, dump_b)
        if "inputs" not in summary:
            diff.summary.setdefault("notes", []).append(
                "this compare result predates input fingerprints: not checked against the dumps")
        return diff

    # -- per node ---------------------------------------------------------------------------

    @property
    def paired(self) -> bool:
        return self.graphs["b"] is not None

    def graph(self, side: str) -> Graph:
        g = self.graphs[side]
        if g is None:
            raise KeyError(f"no dump on side {side}")
        return g

    def _direct(self, side: str, name: str) -> NodePair | None:
        """The node's pair with its own counterpart (not a stand-in), if any."""
        p = self._pair[side].get(name)
        return p if p and p.node_a and p.node_b and p.match_method not in PROXY_METHODS else None

    def counterpart(self, side: str, name: str) -> str | None:
        """The matched node on the other side, if any."""
        p = self._pair[side].get(name)
        if p is None:
            return None
        return p.node_b if side == "a" else p.node_a

    def score(self, side: str, name: str) -> float | None:
        """The pair's precision score: the compare result's, else computed from the statistics."""
        p = self._pair[side].get(name)
        if p is None or not (p.node_a and p.node_b) or p.match_method in PROXY_METHODS:
            return None
        self.band(side, name)
        return p.score

    def state(self, side: str, name: str) -> str:
        """The node's colour: its own verdict in the compare (pass | warning | error | nan |
        unmatched; a node compared inside an ancestor or a container: that pair's); for a pair
        given without a verdict, ``nan`` when one side alone holds NaN/Inf, else its precision
        band; with one dump, ``nan`` or ``none``."""
        cached = self._state[side].get(name)
        if cached is not None:
            return cached
        p = self._pair[side].get(name)
        twin = self.counterpart(side, name)
        if not self.paired:
            result = B.NAN if self.nonfinite(side, name) else B.NONE
        elif p is not None and p.verdict:
            result = p.verdict if p.verdict in STATES else B.NONE
        elif self._direct(side, name) and self.nonfinite(side, name) != self.nonfinite(_other(side), twin):
            result = B.NAN
        else:
            result = self.band(side, name)
        self._state[side][name] = result
        return result

    def proxy(self, side: str, name: str) -> bool:
        """Whether the node has no counterpart of its own and takes a stand-in's verdict (its
        nearest matched ancestor's, a container's children's)."""
        p = self._pair[side].get(name)
        return p is not None and p.match_method in ("ancestor", "container")

    def impact(self, side: str, name: str) -> tuple[str, tuple[str, str] | None]:
        """``("origin", None)`` when a divergence starts at the node, ``("affected", (side,
        node))`` when it comes from that earlier node (on this side when it has a name here),
        ``("", None)`` otherwise (from :func:`compare.localise.with_impact`)."""
        p = self._direct(side, name)
        if p is None or self.state(side, name) not in (B.WARNING, B.ERROR, B.NAN):
            return "", None
        if p.origin:
            return "origin", None
        mine, theirs = (p.affected_a, p.affected_b) if side == "a" else (p.affected_b, p.affected_a)
        for s, n in ((side, mine), (_other(side), theirs)):
            if n and self.graphs[s] is not None and n in self.graph(s):
                return "affected", (s, n)
        return "", None

    def band(self, side: str, name: str) -> str:
        """The precision band of the pair's score (see :mod:`visualizer.bands`): pass |
        warning | error | unmatched | none (no numerics to judge, or one dump)."""
        cached = self._band[side].get(name)
        if cached is not None:
            return cached
        result = B.NONE
        if self.paired:
            p = self._pair[side].get(name)
            if p is None or not (p.node_a and p.node_b) or p.match_method in PROXY_METHODS:
                has_data = self.graph(side).recorded(name)
                result = B.UNMATCHED if has_data or p is not None else B.NONE
            else:
                if p.score is None:
                    p.score = B.node_score(self.graph("a").tensors(p.node_a),
                                           self.graph("b").tensors(p.node_b))
                result = B.band(p.score)
        self._band[side][name] = result
        return result

    def worst_below(self, side: str, name: str) -> str:
        """The worst state among the descendants of ``name`` (shown on a collapsed node)."""
        memo = self._worst[side]
        if name in memo:
            return memo[name]
        g = self.graph(side)
        stack = [(name, False)]
        while stack:
            node, done = stack.pop()
            if node in memo:
                continue
            kids = g.children(node)
            if done or not kids:
                worst = B.NONE
                for k in kids:
                    for cand in (self.state(side, k), memo[k]):
                        if B.SEVERITY[cand] > B.SEVERITY[worst]:
                            worst = cand
                memo[node] = worst
            else:
                stack.append((node, True))
                stack.extend((k, False) for k in kids if k not in memo)
        return memo[name]

    def nonfinite(self, side: str, name: str) -> bool:
        return self.graph(side).nonfinite(name)

    # -- whole graph ------------------------------------------------------------------------

    def warm(self) -> None:
        """Compute every state, the worst state below every top-level node, the execution order
        and the search index (what a UI may do in the background after its first paint)."""
        with self._warm_lock:
            if self._warm.is_set():
                return
            for side in SIDES if self.paired else ("a",):
                for root in self.graph(side).roots():
                    self.worst_below(side, root)
            for side, n in self._in_order():
                self.state(side, n)
            self._search_index()
            self._warm.set()

    @property
    def warmed(self) -> bool:
        return self._warm.is_set()

    def _in_order(self) -> list[tuple[str, str]]:
        """Every node in execution order: side a, then the nodes of side b left unmatched."""
        if self._order is None:
            out = [("a", n) for n in self.graph("a").walk()]
            if self.paired:
                out += [("b", n) for n in self.graph("b").walk() if self._direct("b", n) is None]
            self._order = out
        return self._order

    def first_divergence(self) -> tuple[str, str] | None:
        """(side, node) where numerics first go wrong: the compare summary's, else the first
        node in execution order whose band is ``error`` with no ``error`` below it."""
        if not self.paired:
            return None
        named = self._summary_node("first_divergence")
        if named:
            return named
        for side, n in self._in_order():
            if side == "a" and self.band(side, n) == B.ERROR and self.worst_below(side, n) != B.ERROR:
                return side, n
        return None

    def first_nan(self) -> tuple[str, str] | None:
        """(side, node) of the first node in execution order with a NaN/Inf statistic."""
        named = self._summary_node("first_nan")
        if named:
            return named
        sides = SIDES if self.paired else ("a",)
        for side in sides:
            g = self.graph(side)
            for n in g.walk():
                if g.nonfinite(n) and not any(g.nonfinite(k) for k in g.children(n)):
                    return side, n
        return None

    def _summary_node(self, key: str) -> tuple[str, str] | None:
        v = self.summary.get(key)
        if isinstance(v, Mapping):
            named = [("a", v.get("a") or v.get("node_a")), ("b", v.get("b") or v.get("node_b"))]
        elif isinstance(v, (list, tuple)) and v:
            named = [("a", v[0]), ("b", v[1] if len(v) > 1 else v[0])]
        else:
            named = [("a", v), ("b", v)]
        for side, name in named:
            g = self.graphs[side]
            if name and g is not None and name in g:
                return side, str(name)
        return None

    def filter(self, kinds: Iterable[str]) -> list[tuple[str, str]]:
        """Nodes in execution order whose state is in ``kinds`` (error, warning, unmatched,
        nan); a ``nan`` node is listed on the side that holds the NaN/Inf."""
        kinds = set(kinds)
        out = []
        for side, n in self._in_order():
            st = self.state(side, n)
            if st not in kinds:
                continue
            twin = self.counterpart(side, n)
            if st == B.NAN and not self.nonfinite(side, n) and twin and self.nonfinite(_other(side), twin):
                out.append((_other(side), twin))
            else:
                out.append((side, n))
        return out

    def search(self, query: str) -> list[tuple[str, str]]:
        """Nodes whose name or label matches ``query`` (fuzzy, case-insensitive), execution order."""
        keys = self._search_index()
        return [keys[t] for t in find(query, keys)]

    def _search_index(self) -> dict[str, tuple[str, str]]:
        if self._search_keys is None:
            self._search_keys = {f"{n} {self.graph(side).nodes[n].label}": (side, n)
                                 for side, n in self._in_order()}
        return self._search_keys

    def reveal(self, side: str, name: str) -> dict[str, list[str]]:
        """The nodes to expand on each side so that ``name`` and its counterpart are visible."""
        out = {side: self.graph(side).ancestors(name), _other(side): []}
        twin = self.counterpart(side, name)
        if twin and twin in (self.graphs[_other(side)] or ()):
            out[_other(side)] = self.graph(_other(side)).ancestors(twin)
        return out

    # -- detail -----------------------------------------------------------------------------

    def _metric_rows(self, node_a: str | None, node_b: str | None) -> list[dict[str, Any]]:
        if self._rows_by is None:
            self._rows_by = {}
            for r in self._rows:
                self._rows_by.setdefault((r.get("node_a"), r.get("node_b")), []).append(r)
        return self._rows_by.get((node_a, node_b), [])

    def detail(self, side: str, name: str) -> Detail:
        """Both sides' statistics, the pair's metrics, verdict with reason, and the stacks."""
        twin = self.counterpart(side, name)
        na, nb = (name, twin) if side == "a" else (twin, name)
        p = self._pair[side].get(name)
        state = self.state(side, name)
        impact, source = self.impact(side, name)
        ga, gb = self.graphs["a"], self.graphs["b"]
        return Detail(
            node_a=na, node_b=nb, state=state, score=self.score(side, name),
            match_method=p.match_method if p else "",
            reason=p.reason if p else ("no counterpart on the other side" if state == B.UNMATCHED else ""),
            impact=impact, affected_by=source,
            tensors_a=ga.tensors(na) if na and ga is not None else [],
            tensors_b=gb.tensors(nb) if nb and gb is not None else [],
            metrics=self._metric_rows(na, nb),
            stack_a=ga.stack(na) if na and ga is not None else [],
            stack_b=gb.stack(nb) if nb and gb is not None else [],
            nonfinite=bool((na and ga is not None and ga.nonfinite(na))
                           or (nb and gb is not None and gb.nonfinite(nb))))

    def counts(self) -> dict[str, int]:
        """Node verdicts: how many node pairs (a compare's nodes.parquet rows) have each."""
        return self.labelled_counts()["nodes"]

    def labelled_counts(self) -> dict[str, Any]:
        """The compare's labelled counts (:func:`compare.verdict.counts`) of the tensor rows and
        node pairs this diff holds: what summary.json's ``counts`` says of the same result."""
        from compare.verdict import counts

        def verdict(p: NodePair) -> str:
            side, name = ("a", p.node_a) if p.node_a else ("b", p.node_b)
            return p.verdict or (self.state(side, name) if name in (self.graphs[side] or ()) else B.NONE)
        return counts([r.get("verdict") for r in self._rows if r.get("verdict")],
                      [verdict(p) for p in self.pairs], [p.node_a for p in self.pairs],
                      [p.node_b for p in self.pairs])
