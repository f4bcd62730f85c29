"""The diff graph: two hierarchy graphs, their matched node pairs and each node's state.

Built from a compare result (``compare.api.compare`` or ``compare.api.load_result``), or from one
dump alone (no pairs; NaN/Inf still found). A node's state, its colour, is its own verdict in
the compare (:mod:`probe.compare.verdict`); whether its divergence starts there or comes from upstream
(:func:`probe.compare.localise.with_impact`) is told apart by :meth:`DiffGraph.impact`. A compare
result of other dumps than the ones given is refused (:attr:`DiffGraph.refusal`). Everything
is computed when first asked for: states of the nodes on screen, the worst state below a
collapsed node. Finding nodes (first divergence, first NaN, filters, search) is
:mod:`probe.visualizer.navigate`; what the detail panel shows of a node is :mod:`probe.visualizer.detail`.

>>> from probe.visualizer.graph import Graph
>>> g = Graph.load("/work/shared/data/msprobe/torch_L0")                      # doctest: +SKIP
>>> d = DiffGraph(g)                                                           # doctest: +SKIP
>>> d.band("a", g.roots()[0])                                                  # doctest: +SKIP
'none'
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable, Mapping

from probe.ground.errors import ProbeError
from probe.visualizer import bands as B
from probe.visualizer.graph import GROUP, Graph, dump_source, load_graph
from probe.visualizer.pairs import PROXY_METHODS, NodePair, as_mapping, node_pairs, records

SIDES = ("a", "b")
#: What the filter list can show.
FILTERS = ("error", "warning", "unmatched", "nan")
#: States a compare verdict can give a node.
STATES = frozenset({B.PASS, B.WARNING, B.ERROR, B.NAN, B.UNMATCHED})


def other_side(side: str) -> str:
    """The side facing ``side``: ``"b"`` for ``"a"`` and back."""
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
        #: the compare's per-tensor rows (:mod:`probe.visualizer.detail` shows a pair's)
        self.rows = list(rows)
        self._rows_by: dict[tuple[str | None, str | None], list[dict]] | None = None
        self._twins: dict[str, dict[str, str | None]] = {"a": {}, "b": {}}
        self._worst: dict[str, dict[str, str]] = {"a": {}, "b": {}}
        self._band: dict[str, dict[str, str]] = {"a": {}, "b": {}}
        self._state: dict[str, dict[str, str]] = {"a": {}, "b": {}}
        self._search_keys: dict[str, tuple[str, str]] | None = None
        #: answers of :mod:`probe.visualizer.navigate` that hold for the whole diff, computed once
        self.found: dict[Any, Any] = {}
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
        from probe.collectors.records import NODE, TENSOR

        diff = cls(Graph(TENSOR.empty_table(), NODE.empty_table()))
        diff.refusal = message
        return diff

    @classmethod
    def from_dumps(cls, dump_a: str | os.PathLike | None, dump_b: str | os.PathLike | None = None,
                   compare_dir: str | os.PathLike | None = None,
                   mapping: str | os.PathLike | None = None, *, step: int | None = None,
                   rank: int | None = None) -> "DiffGraph":
        """One dump; two dumps compared now with ``compare.api.compare``; or the result written
        by ``probe compare --out compare_dir`` (its dumps found from its summary when not given),
        refused (:meth:`refused`) when its inputs' fingerprints are not those of the dumps.
        ``step`` and ``rank`` choose among a dump folder's dumps (the lowest by default)."""
        if compare_dir is None:
            if dump_a is None:
                raise ProbeError("give a dump (--dump A [B]) or a compare result (--compare DIR)")
            if dump_b is None:
                return cls(Graph.load(dump_a, step, rank))
        try:
            from probe.compare import api
        except ImportError as e:
            raise ProbeError(f"compare is not available ({e}); open one dump at a time") from None
        if compare_dir is None:
            if step is None and rank is None:
                return cls.from_result(api.compare(str(dump_a), str(dump_b), mapping=mapping), dump_a, dump_b)
            ga, gb = Graph.load(dump_a, step, rank), Graph.load(dump_b, step, rank)
            return cls.from_result(api.compare(str(ga.source), str(gb.source), mapping=mapping), ga, gb)
        result = api.load_result(compare_dir)
        summary = as_mapping(getattr(result, "summary", None))
        dump_a = dump_a if dump_a is not None else summary.get("a")
        dump_b = dump_b if dump_b is not None else summary.get("b")
        if not dump_a or not dump_b:
            raise ProbeError(f"{compare_dir}: the result does not name its dumps; give them too (--dump A B)")
        from probe.compare.fingerprint import foreign_input

        why = foreign_input(summary, {"a": dump_source(dump_a, step, rank), "b": dump_source(dump_b, step, rank)})
        if why:
            return cls.refused(f"{compare_dir}: this compare result belongs to other dumps: {why}. "
                               f"Compare these dumps (probe compare {dump_a} {dump_b} --out DIR) "
                               "and open that result.")
        diff = cls.from_result(result, Graph.load(dump_a, step, rank), Graph.load(dump_b, step, rank))
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
        """The matched node on the other side, if any (for a group of top-level API calls: the
        group that holds the counterpart of its first matched call)."""
        p = self._pair[side].get(name)
        if p is not None:
            return p.node_b if side == "a" else p.node_a
        g = self.graphs[side]
        if not self.paired or g is None or name not in g or g.nodes[name].kind != GROUP:
            return None
        memo = self._twins[side]
        if name not in memo:
            other = self.graph(other_side(side))
            memo[name] = None
            for kid in g.children(name):
                twin = self.counterpart(side, kid)
                if twin in other:
                    top = (other.ancestors(twin) or [twin])[0]
                    memo[name] = top if other.nodes[top].kind == GROUP else None
                    break
        return memo[name]

    def pair(self, side: str, name: str) -> NodePair | None:
        """The compare's pair of the node (its own, or a stand-in's), if any."""
        return self._pair[side].get(name)

    def metric_rows(self, node_a: str | None, node_b: str | None) -> list[dict[str, Any]]:
        """The compare's per-tensor rows of the pair (``node_a``, ``node_b``)."""
        if self._rows_by is None:
            self._rows_by = {}
            for r in self.rows:
                self._rows_by.setdefault((r.get("node_a"), r.get("node_b")), []).append(r)
        return self._rows_by.get((node_a, node_b), [])

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
        elif self._direct(side, name) and self.nonfinite(side, name) != self.nonfinite(other_side(side), twin):
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
        ``("", None)`` otherwise (from :func:`probe.compare.localise.with_impact`)."""
        p = self._direct(side, name)
        if p is None or self.state(side, name) not in (B.WARNING, B.ERROR, B.NAN):
            return "", None
        if p.origin:
            return "origin", None
        mine, theirs = (p.affected_a, p.affected_b) if side == "a" else (p.affected_b, p.affected_a)
        for s, n in ((side, mine), (other_side(side), theirs)):
            if n and self.graphs[s] is not None and n in self.graph(s):
                return "affected", (s, n)
        return "", None

    def band(self, side: str, name: str) -> str:
        """The precision band of the pair's score (see :mod:`probe.visualizer.bands`): pass |
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
            for side, n in self.in_order():
                self.state(side, n)
            self.search_keys()
            self._warm.set()

    @property
    def warmed(self) -> bool:
        return self._warm.is_set()

    def in_order(self) -> list[tuple[str, str]]:
        """Every node in execution order: side a, then the nodes of side b left unmatched."""
        if self._order is None:
            out = [("a", n) for n in self.graph("a").walk()]
            if self.paired:
                out += [("b", n) for n in self.graph("b").walk() if self._direct("b", n) is None]
            self._order = out
        return self._order

    def search_keys(self) -> dict[str, tuple[str, str]]:
        """Search text (name and label) of every node in execution order -> (side, node)."""
        if self._search_keys is None:
            self._search_keys = {f"{n} {self.graph(side).nodes[n].label}": (side, n)
                                 for side, n in self.in_order()}
        return self._search_keys

    def counts(self) -> dict[str, int]:
        """Node verdicts: how many node pairs (a compare's nodes.parquet rows) have each."""
        return self.labelled_counts()["nodes"]

    def labelled_counts(self) -> dict[str, Any]:
        """The compare's labelled counts (:func:`probe.compare.verdict.counts`) of the tensor rows and
        node pairs this diff holds: what summary.json's ``counts`` says of the same result."""
        from probe.compare.verdict import counts

        def verdict(p: NodePair) -> str:
            side, name = ("a", p.node_a) if p.node_a else ("b", p.node_b)
            return p.verdict or (self.state(side, name) if name in (self.graphs[side] or ()) else B.NONE)
        return counts([r.get("verdict") for r in self.rows if r.get("verdict")],
                      [verdict(p) for p in self.pairs], [p.node_a for p in self.pairs],
                      [p.node_b for p in self.pairs])
