"""What one side of the graph-diff page shows, and what changes when nodes open or close.

The visible nodes of a side are its top-level nodes and the children of every visible expanded
node. Each is one *entry*, the same for the tree (a row) and the graph (a box):

``n`` name · ``p`` parent (None at the top) · ``l`` label · ``g`` kind · ``c`` classes (the
fill: the node's own verdict, ``band-<state>``; marks: ``origin``, ``affected``, ``proxy``,
``nan``, ``nomatch`` when a paired diff has no counterpart for it; ``check-<verdict>`` on a call
the API precision check flagged, ``check-in`` on a node holding some, whose label then ends in a
badge: :mod:`probe.visualizer.check_marks`) · ``k`` has children · ``o``
open · ``h`` the worst state hidden inside a collapsed node · ``t`` its counterpart on the other
side · ``a``/``an`` label and name of the node an affected one comes from · ``x``, ``y``,
``w``, ``hh`` its box (:mod:`probe.visualizer.layout`, relative to its parent).

Edges are the data-flow edges (:meth:`probe.visualizer.graph.Graph.flow`) lifted to the visible
nodes: each end to its deepest visible ancestor (or itself); an edge whose ends lift to one node,
or to a node and its ancestor, is not drawn.

:meth:`SideView.delta` says what changes from one set of expanded nodes to another, so that a
client holding the first view reaches the second with only: ``add`` (new entries, parents
before children, siblings in order), ``prune`` (nodes whose children all went), ``set``
(entries whose box or open state changed: only the changed fields) and ``ea``/``er`` (edges
added and removed, ``[src, dst]``). Only the nodes that opened or closed and their ancestors'
siblings are visited.

>>> v = SideView(diff, "a")                                              # doctest: +SKIP
>>> d = v.delta(set(), {"Module.layers.0.Block.forward.0"})               # doctest: +SKIP
>>> [e["n"] for e in d["add"]][:2]                                        # doctest: +SKIP
['Module.layers.0.input_norm.RMSNorm.forward.0', 'Module.layers.0.attn.Attention.forward.0']
"""

from __future__ import annotations

from typing import Any, Collection

from probe.visualizer import bands as B
from probe.visualizer.check_marks import CheckMarks
from probe.visualizer.diff import DiffGraph
from probe.visualizer.layout import Box, Layout

HINTS = (B.NAN, B.ERROR, B.WARNING)


class SideView:
    """The entries, edges and deltas of one side of a diff graph (see the module docstring)."""

    def __init__(self, diff: DiffGraph, side: str, checks: CheckMarks | None = None) -> None:
        self.diff = diff
        self.side = side
        self.graph = diff.graph(side)
        #: the API precision check's flagged calls of this side's dump (:mod:`probe.visualizer.check_marks`)
        self.checks = checks
        self.layout = Layout(self.graph, (lambda n: checks.label(self.graph, n)) if checks else None)
        self._incident: dict[str, list[int]] | None = None

    # -- which nodes show -----------------------------------------------------------------

    def visible(self, expanded: Collection[str]) -> list[str]:
        """The visible nodes, depth first in execution order (the order of the tree's rows)."""
        g = self.graph
        out: list[str] = []
        stack = list(reversed(g.roots()))
        while stack:
            name = stack.pop()
            out.append(name)
            if name in expanded:
                stack.extend(reversed(g.children(name)))
        return out

    def _shown(self, name: str, expanded: Collection[str]) -> bool:
        return all(a in expanded for a in self.graph.ancestors(name))

    # -- entries --------------------------------------------------------------------------

    def classes(self, name: str) -> str:
        """The fill (own verdict) and the marks of a node, as CSS classes."""
        d, side = self.diff, self.side
        cls = f"band-{d.state(side, name)}"
        impact, _ = d.impact(side, name)
        if impact:
            cls += f" {impact}"
        if d.proxy(side, name):
            cls += " proxy"
        if d.nonfinite(side, name):
            cls += " nan"
        if d.paired and d.counterpart(side, name) is None:
            cls += " nomatch"
        if self.checks:
            cls += self.checks.classes(self.graph, name)
        return cls

    def entry(self, name: str, expanded: Collection[str], box: Box) -> dict[str, Any]:
        """The entry of a visible node (see the module docstring)."""
        d, g = self.diff, self.graph
        node = g.nodes[name]
        has_kids = g.has_children(name)
        open_ = has_kids and name in expanded
        label = self.checks.label(g, name) if self.checks else node.label
        out = {"n": name, "p": node.parent, "l": label, "g": node.kind, "c": self.classes(name),
               "k": int(has_kids), "o": int(open_), "h": self.hint(name, open_), "t": d.counterpart(self.side, name),
               "x": round(box.x, 1), "y": round(box.y, 1), "w": round(box.w, 1), "hh": round(box.h, 1)}
        _, source = d.impact(self.side, name)
        if source:
            out.update(a=d.graph(source[0]).nodes[source[1]].label, an=source[1])
        return out

    def hint(self, name: str, open_: bool) -> str:
        """The worst state inside a collapsed node, when it is worth a mark (nan, error, warning)."""
        if open_ or not self.diff.paired or not self.graph.has_children(name):
            return ""
        worst = self.diff.worst_below(self.side, name)
        return worst if worst in HINTS else ""

    # -- edges ----------------------------------------------------------------------------

    def lift(self, name: str, expanded: Collection[str]) -> str:
        """The deepest visible node holding ``name`` (itself when visible)."""
        for a in self.graph.ancestors(name):
            if a not in expanded:
                return a
        return name

    def _edge(self, src: str, dst: str, expanded: Collection[str]) -> tuple[str, str] | None:
        s, t = self.lift(src, expanded), self.lift(dst, expanded)
        if s == t or self.graph.within(s, t) or self.graph.within(t, s):
            return None
        return s, t

    def edges(self, expanded: Collection[str], among: Collection[int] | None = None) -> set[tuple[str, str]]:
        """The data-flow edges between visible nodes (of the flow edges ``among``, by index)."""
        flow = self.graph.flow()
        out = set()
        for i in range(len(flow)) if among is None else among:
            e = self._edge(flow[i].src, flow[i].dst, expanded)
            if e:
                out.add(e)
        return out

    def prepare(self) -> None:
        """Index the data-flow edges by the nodes that hold their ends (what the first delta
        would otherwise do; a UI may call it in the background)."""
        self._touching(())

    def _touching(self, names: Collection[str]) -> set[int]:
        """Indexes of the flow edges with an end inside one of ``names``."""
        if self._incident is None:
            inc: dict[str, list[int]] = {}
            for i, e in enumerate(self.graph.flow()):
                for end in {e.src, e.dst}:
                    for a in set(self.graph.ancestors(end)) | {end}:
                        inc.setdefault(a, []).append(i)
            self._incident = inc
        out: set[int] = set()
        for n in names:
            out.update(self._incident.get(n, ()))
        return out

    # -- whole views and deltas -------------------------------------------------------------

    def full(self, expanded: Collection[str]) -> dict[str, Any]:
        """The whole view of ``expanded`` as a delta from nothing (``reset``: drop what is held)."""
        boxes = self.layout.boxes(expanded)
        return {"reset": True, "add": [self.entry(n, expanded, boxes[n]) for n in self.visible(expanded)],
                "prune": [], "set": [], "ea": sorted(map(list, self.edges(expanded))), "er": []}

    def delta(self, old: Collection[str], new: Collection[str]) -> dict[str, Any]:
        """What changes from the view of ``old`` expanded nodes to that of ``new`` (see the
        module docstring)."""
        old, new = set(old), set(new)
        toggled = [n for n in old ^ new if n in self.graph and self.graph.has_children(n)
                   and (self._shown(n, old) or self._shown(n, new))]
        if not toggled:
            return {"add": [], "prune": [], "set": [], "ea": [], "er": []}
        lay = self.layout
        size0, size1 = lay.sizes(old), lay.sizes(new)
        before: dict[str, Box] = {}
        after: dict[str, Box] = {}
        add, prune = [], []
        for n in self._changed_parents(toggled):
            was, now = n in size0, n in size1
            if was and not now:
                prune.append(n)
            elif now and not was:
                for k in self.visible_below(n, new):
                    parent = self.graph.nodes[k].parent
                    if k not in after:
                        after.update(lay.child_boxes(parent, size1))
                    add.append(self.entry(k, new, after[k]))
            elif now:
                before.update(lay.child_boxes(n, size0))
                after.update(lay.child_boxes(n, size1))
        added = {e["n"] for e in add}
        sets = []
        for k in dict.fromkeys(list(before) + toggled):
            if k in added or k not in after:
                continue
            fields = {}
            b0, b1 = before.get(k), after[k]
            if b0 != b1:
                fields.update(x=round(b1.x, 1), y=round(b1.y, 1), w=round(b1.w, 1), hh=round(b1.h, 1))
            if k in toggled:
                open_ = int(k in new)
                fields.update(o=open_, h=self.hint(k, bool(open_)))
            if fields:
                sets.append(dict(fields, n=k))
        among = self._touching(toggled)
        e0, e1 = self.edges(old, among), self.edges(new, among)
        return {"add": add, "prune": [p for p in prune if p is not None], "set": sets,
                "ea": sorted(map(list, e1 - e0)), "er": sorted(map(list, e0 - e1))}

    def visible_below(self, name: str, expanded: Collection[str]) -> list[str]:
        """The visible descendants of an expanded ``name``, depth first in execution order."""
        out: list[str] = []
        stack = list(reversed(self.graph.children(name)))
        while stack:
            k = stack.pop()
            out.append(k)
            if k in expanded:
                stack.extend(reversed(self.graph.children(k)))
        return out

    def _changed_parents(self, toggled: list[str]) -> list[str | None]:
        """The toggled nodes and all their ancestors (and the top level), outermost first, with
        no node under a toggled node that shows or hides it anyway."""
        g = self.graph
        out: dict[str | None, int] = {None: 0}
        for n in toggled:
            for depth, a in enumerate(g.ancestors(n) + [n], start=1):
                out.setdefault(a, depth)
        toggled_set = set(toggled)
        keep = [n for n in out if n is None or not any(a in toggled_set for a in g.ancestors(n))]
        return sorted(keep, key=lambda n: out[n])
