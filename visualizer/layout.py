"""A layered layout of the visible part of a hierarchy graph: where each box goes.

A collapsed node is one box; an expanded node is a box that holds its children's layout under
a header line. Inside a box (and at the top level):

1. the children's data-flow edges are lifted to the children (an edge between two nodes inside
   different children joins those children);
2. each child goes to a layer: 0 when no sibling feeds it, else one below the lowest layer of
   the siblings that feed it (longest path; an edge against execution order is left out, so
   the layers never loop);
3. a layer is a row of boxes in execution order, wrapped after :data:`ROW_MAX` boxes; rows
   stack top to bottom, each centred on the axis the rows would share with every child
   collapsed (a row that an opened child widens grows to the right of it instead of pushing
   the other rows aside).

Positions are relative to the parent's top-left corner (the top level: to the origin), so that
expanding one node moves only its siblings and its ancestors' siblings: what a client redraws.
The lifted edges and the layering of each parent are computed once; a parent's arrangement is
cached by the sizes of its children.

>>> lay = Layout(Graph.load("dump"))                                      # doctest: +SKIP
>>> lay.boxes(expanded={"Module.layers.0.Block.forward.0"})["Module.embed.Embedding.forward.0"]  # doctest: +SKIP
Box(x=0.0, y=0.0, w=190.0, h=28.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection

from probe.visualizer.graph import Graph

NODE_H = 28.0
GAP_X = 18.0
GAP_Y = 34.0
PAD = 12.0
HEAD = 22.0
CHAR_W = 6.4
MIN_W, MAX_W = 70.0, 300.0
#: Boxes side by side in one row of a layer before it wraps.
ROW_MAX = 8
_CACHE_MAX = 50_000


@dataclass(frozen=True)
class Box:
    """A node's box: top-left corner relative to its parent's (``x``, ``y``), width and height."""

    x: float
    y: float
    w: float
    h: float


class Layout:
    """The layered layout of one graph (see the module docstring)."""

    def __init__(self, graph: Graph, label: Callable[[str], str] | None = None) -> None:
        self.graph = graph
        #: the text drawn in a node's box (its width follows it): the node's label by default
        self.label = label or (lambda name: graph.nodes[name].label)
        self._sibling_edges: dict[str | None, set[tuple[str, str]]] | None = None
        self._rows: dict[str | None, list[list[str]]] = {}
        self._arranged: dict[tuple, tuple[list[tuple[float, float]], float, float]] = {}
        self._leaf: dict[str, tuple[float, float]] = {}

    def leaf_size(self, name: str) -> tuple[float, float]:
        """Width and height of the node drawn collapsed (its label decides the width)."""
        got = self._leaf.get(name)
        if got is None:
            label = self.label(name)
            got = self._leaf[name] = (min(MAX_W, max(MIN_W, len(label) * CHAR_W + 20.0)), NODE_H)
        return got

    def _size(self, name: str, sizes: dict[str | None, tuple[float, float]]) -> tuple[float, float]:
        got = sizes.get(name)
        return got if got is not None else self.leaf_size(name)

    def children_of(self, parent: str | None) -> list[str]:
        return self.graph.roots() if parent is None else self.graph.children(parent)

    def _lifted(self) -> dict[str | None, set[tuple[str, str]]]:
        """Every data-flow edge lifted to the two children of its ends' lowest common ancestor."""
        if self._sibling_edges is None:
            g = self.graph
            out: dict[str | None, set[tuple[str, str]]] = {}
            for e in g.flow():
                sa, da = g.ancestors(e.src) + [e.src], g.ancestors(e.dst) + [e.dst]
                i = 0
                while i < len(sa) and i < len(da) and sa[i] == da[i]:
                    i += 1
                if i < len(sa) and i < len(da):
                    out.setdefault(sa[i - 1] if i else None, set()).add((sa[i], da[i]))
            self._sibling_edges = out
        return self._sibling_edges

    def rows(self, parent: str | None) -> list[list[str]]:
        """The children of ``parent`` (None: the top level) as rows of boxes, top to bottom."""
        got = self._rows.get(parent)
        if got is None:
            kids = self.children_of(parent)
            index = {k: i for i, k in enumerate(kids)}
            feeds: dict[str, list[str]] = {}
            for s, d in self._lifted().get(parent, ()):
                if index[s] < index[d]:
                    feeds.setdefault(d, []).append(s)
            layer: dict[str, int] = {}
            for k in kids:
                layer[k] = max((layer[s] + 1 for s in feeds.get(k, ())), default=0)
            layers: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
            for k in kids:
                layers[layer[k]].append(k)
            got = [layer_[i:i + ROW_MAX] for layer_ in layers for i in range(0, len(layer_), ROW_MAX)]
            self._rows[parent] = got
        return got

    def _collapsed_width(self, parent: str | None) -> float:
        """The widest row of ``parent``'s children with every child collapsed."""
        return max((sum(self.leaf_size(k)[0] for k in row) + GAP_X * (len(row) - 1)
                    for row in self.rows(parent)), default=0.0)

    def _arrange(self, parent: str | None, sizes: dict[str | None, tuple[float, float]]):
        """Positions of ``parent``'s children and the parent's own size, given the sizes of its
        expanded children (the others are drawn collapsed)."""
        rows = self.rows(parent)
        size = self._size
        key = (parent, tuple(size(k, sizes) for row in rows for k in row))
        got = self._arranged.get(key)
        if got is not None:
            return got
        pad, head = (0.0, 0.0) if parent is None else (PAD, HEAD)
        widths = [sum(size(k, sizes)[0] for k in row) + GAP_X * (len(row) - 1) for row in rows]
        axis = pad + self._collapsed_width(parent) / 2
        positions = []
        right = pad
        y = pad + head
        for row, width in zip(rows, widths):
            x = max(pad, axis - width / 2)
            right = max(right, x + width)
            height = max(size(k, sizes)[1] for k in row)
            for k in row:
                w, h = size(k, sizes)
                positions.append((x, y + (height - h) / 2))
                x += w + GAP_X
            y += height + GAP_Y
        if parent is None:
            w, h = right, y - GAP_Y if rows else 0.0
        else:
            w = max(right + pad, self.leaf_size(parent)[0])
            h = (y - GAP_Y if rows else y) + pad
        got = (positions, w, h)
        if len(self._arranged) >= _CACHE_MAX:
            self._arranged.clear()
        self._arranged[key] = got
        return got

    def sizes(self, expanded: Collection[str]) -> dict[str | None, tuple[float, float]]:
        """The size of every visible expanded node (and of the top level, key None)."""
        g = self.graph
        order: list[str | None] = []
        stack: list[str | None] = [None]
        while stack:                    # parents before children; sized in reverse
            node = stack.pop()
            order.append(node)
            stack.extend(k for k in self.children_of(node) if k in expanded and g.has_children(k))
        out: dict[str | None, tuple[float, float]] = {}
        for node in reversed(order):
            _, w, h = self._arrange(node, out)
            out[node] = (w, h)
        return out

    def child_boxes(self, parent: str | None, sizes: dict[str | None, tuple[float, float]]) -> dict[str, Box]:
        """The boxes of ``parent``'s children, given :meth:`sizes` of the same expanded set."""
        positions, _, _ = self._arrange(parent, sizes)
        kids = [k for row in self.rows(parent) for k in row]
        return {k: Box(x, y, *self._size(k, sizes)) for k, (x, y) in zip(kids, positions)}

    def boxes(self, expanded: Collection[str]) -> dict[str, Box]:
        """The box of every visible node (the top level, and the children of every expanded
        node that is itself visible), relative to its parent."""
        sizes = self.sizes(expanded)
        out: dict[str, Box] = {}
        for parent in sizes:
            out.update(self.child_boxes(parent, sizes))
        return out
