"""The module hierarchy graph of one dump: nodes, nesting, data-flow edges, statistics, stacks.

Nodes are the modules (``Module.*``/``Cell.*``), APIs and collectives of an msprobe-format dump,
nested as construct.json says; children are ordered by execution order and computed only when
a node is first expanded, so a 10k-node dump opens at once. API calls made at the top level
between modules are grouped, as msprobe's graph does, under ``Apis_Between_Modules.N`` nodes
(kind ``group``), so a mix-level dump opens on the model's top modules. Data-flow edges join the
node whose output a tensor is to the nodes that take it as input (:mod:`probe.visualizer.dataflow`). The graph is made of the dump's
tensor and node records (:data:`probe.collectors.records.TENSOR`, :data:`probe.collectors.records.NODE`), as
:func:`probe.collectors.msprobe_reader.read_msprobe_dump` reads them; a node's statistics (inputs,
kwargs, outputs, parameters, parameter gradients) become :class:`TensorStat` when first looked at.

>>> g = Graph.load("/work/shared/data/msprobe/torch_L0")               # doctest: +SKIP
>>> g.roots()[:2]                                                       # doctest: +SKIP
['Module.embed.Linear.forward.0', 'Module.block.Block.forward.0']
>>> [t.slot for t in g.tensors("Module.embed.Linear.forward.0")]      # doctest: +SKIP
['input', 'output', 'parameter', 'parameter']
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import pyarrow as pa

from probe.collectors.msprobe_layout import find_dump, find_dump_files, parse_node_name
from probe.collectors.msprobe_reader import read_msprobe_dump
from probe.collectors.store import STORE_DIRNAME, read_step
from probe.visualizer.dataflow import Edge, flow_edges

#: Kind and class name of the node that groups top-level API calls between two modules.
GROUP = "group"
GROUP_NAME = "Apis_Between_Modules"


@dataclass(frozen=True)
class TensorStat:
    """One tensor (or scalar argument) at a node boundary."""

    slot: str                      # input | kwarg | output | parameter | parameter_grad
    index: str                     # "0", "0.1", "keepdim", "weight"
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    max: float | None = None
    min: float | None = None
    mean: float | None = None
    norm: float | None = None
    md5: str | None = None
    value: str | None = None       # a non-tensor argument, as JSON text
    nan_count: int | None = None
    inf_count: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.slot, self.index)

    @property
    def nonfinite(self) -> bool:
        """True when a statistic is NaN or infinite, or NaN/Inf elements were counted."""
        return bool(self.nan_count or self.inf_count) or any(
            v is not None and not math.isfinite(v) for v in (self.max, self.min, self.mean, self.norm))


@dataclass
class Node:
    """One module, API or collective call."""

    name: str
    kind: str                      # module | api | comm | group
    direction: str                 # forward | backward | ""
    class_name: str
    path: str                      # module path ("layers.0.attn") or API name ("Tensor.__mul__")
    parent: str | None = None
    order: int = 0                 # execution order: first appearance in the dump
    children: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Short display text: ``layers.0.attn (Attention) fwd`` or ``Tensor.__mul__.3 fwd``."""
        arrow = {"forward": "fwd", "backward": "bwd"}.get(self.direction, "")
        if self.kind == GROUP:
            return f"{self.path} ({len(self.children)} calls)"
        if self.kind == "module":
            return f"{self.path} ({self.class_name}) {arrow}".strip()
        return f"{self.path} {arrow}".strip()


def parse_name(name: str) -> tuple[str, str, str, str]:
    """Split a dump name into (kind, direction, class name, path) for display, from
    :func:`probe.collectors.msprobe_reader.parse_node_name`.

    >>> parse_name("Module.layers.0.attn.Attention.forward.0")
    ('module', 'forward', 'Attention', 'layers.0.attn')
    >>> parse_name("Functional.linear.3.backward")
    ('api', 'backward', 'linear', 'Functional.linear.3')
    >>> parse_name("Distributed.all_reduce.0.forward")
    ('comm', 'forward', 'all_reduce', 'Distributed.all_reduce.0')
    """
    kind, prefix, body, direction, call = parse_node_name(name)
    direction = "backward" if direction == "parameters_grad" else direction
    head, _, cls = body.rpartition(".")
    if kind == "module":
        return kind, direction, cls, head or cls
    return kind, direction, cls, f"{prefix}.{body}.{call}"


#: TENSOR record columns a :class:`TensorStat` is made of.
_STAT_COLUMNS = ("node", "slot", "index", "dtype", "shape", "max", "min", "mean", "l2norm", "hash",
                 "value", "nan_count", "inf_count")


class Graph:
    """The hierarchy graph of one dump (see the module docstring), from its tensor and node
    records and the stack lines of each ``stack_ref``."""

    def __init__(self, tensors: pa.Table, nodes: pa.Table, stacks: Mapping[str, list[str]] | None = None,
                 title: str = "") -> None:
        self.title = title
        #: the dump.json or store folder the graph was read from (:meth:`load`), else None
        self.source: Path | None = None
        self.nodes: dict[str, Node] = {}
        self._records = tensors
        self._rows: dict[str, list[int]] | None = None     # node -> its rows in ``tensors``
        self._cols: dict[str, list] = {}
        self._stacks = dict(stacks or {})
        self._stack_ref: dict[str, str] = {}
        self._grads: dict[str, str] = {}          # node name -> its parameters_grad entry name
        self._tensors: dict[str, list[TensorStat]] = {}
        self._flow: list[Edge] | None = None
        self._indexed = False
        self._roots: list[str] = []
        self._walk: list[str] | None = None
        self._add_nodes(nodes)

    @classmethod
    def load(cls, path: str | os.PathLike, step: int | None = None, rank: int | None = None) -> "Graph":
        """Read the dump named by ``path`` (see :func:`dump_source`); ``step`` and ``rank``
        choose among several (the lowest by default). ``source`` says what was read."""
        source = dump_source(path, step, rank)
        if source.name == STORE_DIRNAME:
            tensors, nodes, _, _ = read_step(source.parent, step, rank)
            graph = cls(tensors, nodes, title=str(path))
        else:
            dump = read_msprobe_dump(source)
            graph = cls(dump.tensors, dump.nodes, dump.stacks, title=str(path))
        graph.source = source
        return graph

    def _new(self, name: str, order: int) -> Node:
        kind, direction, cls, path = parse_name(name)
        node = Node(name=name, kind=kind, direction=direction, class_name=cls, path=path, order=order)
        self.nodes[name] = node
        return node

    def _add_nodes(self, nodes: pa.Table) -> None:
        nodes = nodes.sort_by("order")
        names = nodes.column("node").to_pylist()
        parents = nodes.column("parent").to_pylist()
        refs = nodes.column("stack_ref").to_pylist()
        order = 0
        grads = []
        for name, parent, ref in zip(names, parents, refs):
            if ".parameters_grad" in name:
                grads.append(name)
                continue
            if name not in self.nodes:
                self._new(name, order)
                order += 1
                self.nodes[name].parent = parent
            if ref is not None:
                self._stack_ref.setdefault(name, ref)
        for node in list(self.nodes.values()):
            if node.parent and node.parent not in self.nodes:
                self._new(node.parent, order)
                order += 1
        for gname in grads:
            base = gname.replace(".parameters_grad.", ".backward.")
            owner = base if base in self.nodes else gname.replace(".parameters_grad.", ".forward.")
            if owner not in self.nodes:
                owner = base
                self._new(owner, order)
                order += 1
            self._grads[owner] = gname

    def _index(self) -> None:
        """Group children under parents and order them (done once, on the first expand)."""
        if self._indexed:
            return
        first: dict[str, int] = {name: n.order for name, n in self.nodes.items()}
        for name, node in self.nodes.items():
            seen = set()
            parent = node.parent
            while parent and parent not in seen:
                seen.add(parent)
                if first[name] < first[parent]:
                    first[parent] = first[name]
                parent = self.nodes[parent].parent
        for name, node in self.nodes.items():
            node.order = first[name]
            node.children = []
        roots = []
        for name, node in self.nodes.items():
            (self.nodes[node.parent].children if node.parent else roots).append(name)
        key = lambda n: (self.nodes[n].order, n)  # noqa: E731
        for node in self.nodes.values():
            node.children.sort(key=key)
        roots.sort(key=key)
        self._roots = self._group_apis(roots)
        self._indexed = True

    def _group_apis(self, roots: list[str]) -> list[str]:
        """Put each run of top-level API calls between modules under one group node (only when
        modules sit at the top level too: a dump of APIs alone stays flat)."""
        if all(self.nodes[r].kind == "module" for r in roots) or not any(
                self.nodes[r].kind == "module" for r in roots):
            return roots
        out: list[str] = []
        run: list[str] = []
        for name in roots + [None]:
            if name is not None and self.nodes[name].kind != "module":
                run.append(name)
                continue
            if run:
                group = Node(name=f"{GROUP_NAME}.{sum(self.nodes[r].kind == GROUP for r in out)}",
                             kind=GROUP, direction="", class_name=GROUP_NAME, path="",
                             order=self.nodes[run[0]].order, children=run)
                group.path = group.name
                self.nodes[group.name] = group
                for member in run:
                    self.nodes[member].parent = group.name
                out.append(group.name)
                run = []
            if name is not None:
                out.append(name)
        return out

    def roots(self) -> list[str]:
        """Top-level nodes in execution order."""
        self._index()
        return self._roots

    def children(self, name: str) -> list[str]:
        """Children of ``name`` in execution order."""
        self._index()
        return self.nodes[name].children

    def has_children(self, name: str) -> bool:
        self._index()
        return bool(self.nodes[name].children)

    def ancestors(self, name: str) -> list[str]:
        """Ancestors of ``name``, outermost first."""
        self._index()
        out = []
        parent = self.nodes[name].parent
        while parent and parent not in out:
            out.append(parent)
            parent = self.nodes[parent].parent
        return out[::-1]

    def walk(self) -> list[str]:
        """Every node, depth first, in execution order (the order of the filter list)."""
        if self._walk is None:
            out: list[str] = []
            stack = list(reversed(self.roots()))
            while stack:
                name = stack.pop()
                out.append(name)
                stack.extend(reversed(self.nodes[name].children))
            self._walk = out
        return self._walk

    def _node_rows(self) -> dict[str, list[int]]:
        """Rows of the tensor records per node (grouped once, on the first look at statistics)."""
        if self._rows is None:
            self._cols = {c: self._records.column(c).to_pylist() for c in _STAT_COLUMNS}
            rows: dict[str, list[int]] = {}
            for i, node in enumerate(self._cols["node"]):
                rows.setdefault(node, []).append(i)
            self._rows = rows
        return self._rows

    def recorded(self, name: str) -> bool:
        """True when the dump holds statistics of the node (it is not only a container)."""
        rows = self._node_rows()
        return name in rows or self._grads.get(name) in rows

    def tensors(self, name: str) -> list[TensorStat]:
        """Statistics of the node's inputs, kwargs, outputs, parameters and parameter grads."""
        cached = self._tensors.get(name)
        if cached is None:
            rows = self._node_rows()
            c = self._cols
            cached = [TensorStat(
                c["slot"][i], c["index"][i], c["dtype"][i],
                None if c["shape"][i] is None else tuple(c["shape"][i]),
                c["max"][i], c["min"][i], c["mean"][i], c["l2norm"][i], c["hash"][i], c["value"][i],
                c["nan_count"][i], c["inf_count"][i])
                for i in rows.get(name, []) + rows.get(self._grads.get(name, ""), [])]
            self._tensors[name] = cached
        return cached

    def nonfinite(self, name: str) -> bool:
        """True when any tensor of the node has a NaN or Inf statistic."""
        return any(t.nonfinite for t in self.tensors(name))

    def stack(self, name: str) -> list[str]:
        """The call stack msprobe recorded for the node (empty when none)."""
        return self._stacks.get(self._stack_ref.get(name, ""), [])

    def flow(self) -> list[Edge]:
        """Every data-flow edge of the dump, between the deepest nodes that touch each tensor
        (:func:`probe.visualizer.dataflow.flow_edges`), computed on first use."""
        if self._flow is None:
            self._index()
            edges = flow_edges(self._records, {n: node.parent for n, node in self.nodes.items()})
            self._flow = [e for e in edges if e.src in self.nodes and e.dst in self.nodes]
        return self._flow

    def neighbours(self, name: str) -> tuple[list[str], list[str]]:
        """The nodes that feed ``name`` and those it feeds, each lifted to its outermost ancestor
        that does not hold ``name`` (a sibling of ``name`` or of one of its ancestors)."""
        mine = set(self.ancestors(name)) | {name}
        ins: list[str] = []
        outs: list[str] = []
        for e in self.flow():
            src_in, dst_in = self.within(e.src, name), self.within(e.dst, name)
            if src_in == dst_in:
                continue
            other = e.src if dst_in else e.dst
            chain = self.ancestors(other) + [other]
            lifted = next(n for n in chain if n not in mine)
            found = ins if dst_in else outs
            if lifted not in found:
                found.append(lifted)
        return ins, outs

    def within(self, node: str, root: str) -> bool:
        """Whether ``node`` is ``root`` or one of its descendants."""
        while node is not None:
            if node == root:
                return True
            held = self.nodes.get(node)
            node = held.parent if held else None
        return False

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)


def dump_source(path: str | os.PathLike, step: int | None = None, rank: int | None = None) -> Path:
    """What :meth:`Graph.load` reads for ``path``: the dump.json it names (see
    :func:`probe.collectors.msprobe_layout.find_dump`), or a run folder's record store
    (``RUN/store``) when it holds no dump.json."""
    p = Path(path)
    run_dir = p.parent if p.name == STORE_DIRNAME else p
    if (run_dir / STORE_DIRNAME).is_dir() and not find_dump_files(run_dir):
        return run_dir / STORE_DIRNAME
    return find_dump(path, step, rank)


def load_graph(path: str | os.PathLike | Graph) -> Graph:
    """A :class:`Graph` from a path, or the graph itself."""
    return path if isinstance(path, Graph) else Graph.load(Path(path))
