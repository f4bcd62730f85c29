"""The module hierarchy graph of one dump: nodes, nesting, data-flow edges, statistics, stacks.

Nodes are the modules (``Module.*``/``Cell.*``), APIs and collectives of an msprobe-format dump,
nested as construct.json says; children are ordered by execution order and computed only when
a node is first expanded, so a 10k-node dump opens at once. Statistics (inputs, kwargs, outputs,
parameters, parameter gradients) are parsed from dump.json when a node is first looked at.

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
from typing import Any, Iterator

from visualizer.dumpfiles import RawDump, read_dump

MODULE_PREFIXES = ("Module", "Cell")
COMM_PREFIXES = ("Distributed",)
DIRECTIONS = ("forward", "backward")


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
    value: str | None = None       # a non-tensor argument, as text

    @property
    def key(self) -> tuple[str, str]:
        return (self.slot, self.index)

    @property
    def nonfinite(self) -> bool:
        """True when a statistic is NaN or infinite (msprobe records no NaN counts)."""
        return any(v is not None and not math.isfinite(v) for v in (self.max, self.min, self.mean, self.norm))

    @property
    def signature(self) -> tuple | None:
        """Identity of the tensor's values, used to follow data from one node to the next."""
        if self.dtype is None or self.max is None or self.norm is None:
            return None
        return (self.dtype, self.shape, self.max, self.min, self.mean, self.norm)


@dataclass
class Node:
    """One module, API or collective call."""

    name: str
    kind: str                      # module | api | comm
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
        if self.kind == "module":
            return f"{self.path} ({self.class_name}) {arrow}".strip()
        return f"{self.path} {arrow}".strip()


@dataclass(frozen=True)
class Edge:
    """Data flow between two sibling nodes (``kind`` "data": an output seen as a later input;
    "order": execution order, where no shared tensor was found)."""

    src: str
    dst: str
    kind: str


def parse_name(name: str) -> tuple[str, str, str, str]:
    """Split a dump name into (kind, direction, class name, path).

    >>> parse_name("Module.layers.0.attn.Attention.forward.0")
    ('module', 'forward', 'Attention', 'layers.0.attn')
    >>> parse_name("Functional.linear.3.backward")
    ('api', 'backward', 'linear', 'Functional.linear.3')
    >>> parse_name("Distributed.all_reduce.0.forward")
    ('comm', 'forward', 'all_reduce', 'Distributed.all_reduce.0')
    """
    parts = name.split(".")
    prefix = parts[0]
    if prefix in MODULE_PREFIXES:
        # Module.<path...>.<Class>.<direction>.<n>
        for i in range(len(parts) - 2, 0, -1):
            if parts[i] in DIRECTIONS or parts[i] == "parameters_grad":
                direction = parts[i] if parts[i] in DIRECTIONS else "backward"
                cls = parts[i - 1] if i >= 2 else ""
                path = ".".join(parts[1:i - 1]) or cls
                return "module", direction, cls, path
        return "module", "", parts[-1], ".".join(parts[1:])
    kind = "comm" if prefix in COMM_PREFIXES else "api"
    direction = parts[-1] if parts[-1] in DIRECTIONS else ""
    body = parts[:-1] if direction else parts
    # <Prefix>.<api>[.<Primitive class>].<n>
    cls = body[-2] if len(body) >= 3 and body[-1].isdigit() else body[-1]
    return kind, direction, cls, ".".join(body)


def _number(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _flatten(value: Any, slot: str, index: str, out: list[TensorStat]) -> None:
    if value is None:
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _flatten(item, slot, f"{index}.{i}" if index else str(i), out)
        return
    if not isinstance(value, dict):
        out.append(TensorStat(slot, index, value=str(value)))
        return
    if "type" not in value and not any(k in value for k in ("Max", "dtype")):
        for key, item in value.items():
            _flatten(item, slot, f"{index}.{key}" if index else str(key), out)
        return
    if "dtype" in value or "Max" in value:
        shape = value.get("shape")
        out.append(TensorStat(
            slot, index, dtype=str(value.get("dtype")) if value.get("dtype") is not None else None,
            shape=tuple(int(s) for s in shape) if isinstance(shape, list) else None,
            max=_number(value.get("Max")), min=_number(value.get("Min")),
            mean=_number(value.get("Mean")), norm=_number(value.get("Norm")),
            md5=value.get("md5")))
        return
    out.append(TensorStat(slot, index, dtype=str(value.get("type")),
                          value=None if value.get("value") is None else str(value.get("value"))))


def parse_entry(entry: Any, *, grads: bool = False) -> list[TensorStat]:
    """The tensors of one dump.json entry (``grads``: the entry is a ``parameters_grad`` one)."""
    out: list[TensorStat] = []
    if not isinstance(entry, dict):
        return out
    if grads:
        for pname, value in entry.items():
            _flatten(value, "parameter_grad", str(pname), out)
        return out
    for key, slot in (("input_args", "input"), ("input", "input"), ("input_kwargs", "kwarg"),
                      ("output", "output"), ("parameters", "parameter")):
        if key in entry:
            value = entry[key]
            if slot == "parameter" and isinstance(value, dict):
                for pname, pv in value.items():
                    _flatten(pv, slot, str(pname), out)
            elif slot == "kwarg" and isinstance(value, dict):
                for kname, kv in value.items():
                    _flatten(kv, slot, str(kname), out)
            else:
                _flatten(value, slot, "", out)
    return out


class Graph:
    """The hierarchy graph of one dump (see the module docstring)."""

    def __init__(self, raw: RawDump, title: str | None = None) -> None:
        self.raw = raw
        self.title = title or str(raw.path.parent)
        self.nodes: dict[str, Node] = {}
        self._grads: dict[str, str] = {}          # node name -> its parameters_grad entry name
        self._tensors: dict[str, list[TensorStat]] = {}
        self._edges: dict[str | None, list[Edge]] = {}
        self._indexed = False
        self._roots: list[str] = []
        self._walk: list[str] | None = None
        self._add_nodes()

    @classmethod
    def load(cls, path: str | os.PathLike, step: int | None = None, rank: int | None = None) -> "Graph":
        """Read the dump named by ``path`` (see :func:`visualizer.dumpfiles.find_dump`)."""
        return cls(read_dump(path, step, rank), title=str(path))

    def _new(self, name: str, order: int) -> Node:
        kind, direction, cls, path = parse_name(name)
        node = Node(name=name, kind=kind, direction=direction, class_name=cls, path=path, order=order)
        self.nodes[name] = node
        return node

    def _add_nodes(self) -> None:
        order = 0
        for name, parent in self.raw.construct.items():
            if name not in self.nodes:
                self._new(name, order)
                order += 1
            self.nodes[name].parent = parent
        grads = []
        for name in self.raw.data:
            if ".parameters_grad" in name:
                grads.append(name)
            elif name not in self.nodes:
                self._new(name, order)
                order += 1
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
        self._roots = roots
        self._indexed = True

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

    def tensors(self, name: str) -> list[TensorStat]:
        """Statistics of the node's inputs, kwargs, outputs, parameters and parameter grads."""
        cached = self._tensors.get(name)
        if cached is None:
            cached = parse_entry(self.raw.data.get(name))
            if name in self._grads:
                cached += parse_entry(self.raw.data.get(self._grads[name]), grads=True)
            self._tensors[name] = cached
        return cached

    def nonfinite(self, name: str) -> bool:
        """True when any tensor of the node has a NaN or Inf statistic."""
        return any(t.nonfinite for t in self.tensors(name))

    def stack(self, name: str) -> list[str]:
        """The call stack msprobe recorded for the node (empty when none)."""
        return self.raw.stacks.get(name, [])

    def edges(self, parent: str | None = None) -> list[Edge]:
        """Data-flow edges among the children of ``parent`` (``None``: among the roots).

        A child's input whose statistics equal an earlier sibling's output is that output: the
        edge goes from the producer to the consumer. A child fed by no sibling is linked to the
        previous one in execution order.
        """
        if parent in self._edges:
            return self._edges[parent]
        kids = self.roots() if parent is None else self.children(parent)
        producers: dict[tuple, str] = {}
        edges: list[Edge] = []
        for i, kid in enumerate(kids):
            tensors = self.tensors(kid)
            srcs = []
            for t in tensors:
                if t.slot in ("input", "kwarg"):
                    sig = t.signature
                    src = producers.get(sig) if sig else None
                    if src and src != kid and src not in srcs:
                        srcs.append(src)
            edges.extend(Edge(s, kid, "data") for s in srcs)
            if not srcs and i > 0:
                edges.append(Edge(kids[i - 1], kid, "order"))
            for t in tensors:
                if t.slot == "output" and t.signature:
                    producers[t.signature] = kid
        self._edges[parent] = edges
        return edges

    def neighbours(self, name: str) -> tuple[list[str], list[str]]:
        """The siblings that feed ``name`` and those it feeds (its data-flow edges)."""
        edges = self.edges(self.nodes[name].parent)
        return ([e.src for e in edges if e.dst == name], [e.dst for e in edges if e.src == name])

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)


def load_graph(path: str | os.PathLike | Graph) -> Graph:
    """A :class:`Graph` from a path, or the graph itself."""
    return path if isinstance(path, Graph) else Graph.load(Path(path))
