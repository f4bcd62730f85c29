"""Read msprobe-format dumps (dump.json, construct.json, stack.json) into tensor and node records.

msprobe writes one folder per step and process, ``step{N}/rank{R}/`` (or ``proc<pid>`` when no
distributed group was initialised), holding ``dump.json`` (the statistics of every tensor at
every module/API boundary), ``construct.json`` (each node's parent) and ``stack.json`` (call
stacks). This reader takes them as msprobe wrote them: ``NaN``, ``Infinity`` and ``-Infinity``
literals, PyTorch or MindSpore names and dtype strings, statistics, md5 and tensor tasks.

A dump entry becomes tensor records (:data:`collectors.records.TENSOR`), one per tensor or
non-tensor argument, with ``node`` = the entry's name exactly as in dump.json and ``slot``:

==================  ========================  ==========================================
dump.json key       slot                      index
==================  ========================  ==========================================
``input_args``      ``input``                 position, nested as ``0.1``
``input_kwargs``    ``kwarg``                 keyword name
``output``          ``output``                position, nested as ``0.1``
``parameters``      ``parameter``             parameter name as written (``gamma``)
``input`` (bwd)     ``input``                 position (the incoming gradient)
``output`` (bwd)    ``output``                position (the gradient sent upstream)
``*.parameters_grad.N`` entries  ``parameter_grad``  parameter name
==================  ========================  ==========================================

>>> import json, os, tempfile
>>> d = tempfile.mkdtemp()
>>> t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0,
...      "Min": float("nan"), "Mean": 0.5, "Norm": 1.1}
>>> with open(os.path.join(d, "dump.json"), "w") as f:
...     json.dump({"task": "statistics", "level": "L0", "framework": "pytorch",
...                "data": {"Module.fc.Linear.forward.0": {"input_args": [t], "output": [t]}}}, f)
>>> dump = read_msprobe_dump(os.path.join(d, "dump.json"))
>>> dump.tensors.num_rows, dump.tensors.column("slot").to_pylist()
(2, ['input', 'output'])
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from collectors.records import table_from_columns
from probe.errors import ProbeError

__all__ = ["MsprobeDump", "read_msprobe_dump", "parse_node_name", "find_dump_files"]

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(?:rank|proc)(\d+)$")
_MODULE_PREFIXES = ("Module", "Cell")
_TENSOR_TYPES = ("torch.Tensor", "mindspore.Tensor", "torch.nn.parameter.Parameter",
                 "mindspore.common.parameter.Parameter", "numpy.ndarray", "Tensor", "Parameter")


@dataclass
class MsprobeDump:
    """One msprobe dump folder read into record tables."""

    path: str
    tensors: pa.Table
    nodes: pa.Table
    framework: str | None = None
    task: str | None = None
    level: str | None = None
    step: int | None = None
    rank: int | None = None
    dump_data_dir: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def parse_node_name(name: str) -> tuple[str, str, str, str, int]:
    """Split an msprobe dump name into (kind, prefix, body, direction, call index).

    ``kind`` is ``module``, ``api`` or ``comm``; ``direction`` is ``forward``, ``backward``
    or ``parameters_grad``; ``body`` is ``path.Class`` for modules and the API name otherwise.

    >>> parse_node_name("Module.layers.0.attn.q_proj.Linear.forward.0")
    ('module', 'Module', 'layers.0.attn.q_proj.Linear', 'forward', 0)
    >>> parse_node_name("Primitive.matmul.MatMul.3.backward")
    ('api', 'Primitive', 'matmul.MatMul', 'backward', 3)
    >>> parse_node_name("Cell.head.Dense.parameters_grad.0")
    ('module', 'Cell', 'head.Dense', 'parameters_grad', 0)
    """
    parts = name.split(".")
    prefix = parts[0]
    if prefix in _MODULE_PREFIXES and len(parts) >= 4 and parts[-1].isdigit():
        return "module", prefix, ".".join(parts[1:-2]), parts[-2], int(parts[-1])
    if len(parts) >= 4 and parts[-2].isdigit():
        kind = "comm" if prefix == "Distributed" else "api"
        return kind, prefix, ".".join(parts[1:-2]), parts[-1], int(parts[-2])
    if len(parts) >= 4 and parts[-1].isdigit():
        return "module", prefix, ".".join(parts[1:-2]), parts[-2], int(parts[-1])
    return "api", prefix, ".".join(parts[1:]), "forward", 0


def find_dump_files(root: str | os.PathLike) -> list[Path]:
    """Every ``dump.json`` under ``root`` (or ``root`` itself), sorted by step then rank."""
    root = Path(root)
    if root.is_file():
        return [root]
    found = [Path(dp) / "dump.json" for dp, _, files in os.walk(root) if "dump.json" in files]

    def key(p: Path) -> tuple:
        step, rank = _step_rank(p)
        return (step if step is not None else -1, rank if rank is not None else -1, str(p))
    return sorted(found, key=key)


def _step_rank(path: Path) -> tuple[int | None, int | None]:
    step = rank = None
    for part in path.parts:
        m = _STEP_RE.match(part)
        if m:
            step = int(m.group(1))
        m = _RANK_RE.match(part)
        if m:
            rank = int(m.group(1))
    return step, rank


def _load_json(path: Path, what: str) -> Any:
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ProbeError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not text.strip():
        raise ProbeError(f"{path}: the {what} is empty (0 bytes of JSON)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        end = "truncated" if e.pos >= len(text.rstrip()) - 1 else "malformed"
        raise ProbeError(f"{path}: {end} JSON in the {what} at line {e.lineno} column {e.colno} "
                         f"({e.msg}); re-run the dump or give another file") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise ProbeError(f"{path}: unreadable {what} ({type(e).__name__})") from None


def _f(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None if v is None else float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _floats(values: list) -> pa.Array:
    """A float64 array; the fast path takes ints/floats/None, the slow one anything else."""
    try:
        return pa.array(values, type=pa.float64(), from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array([_f(v) for v in values], type=pa.float64())


class _Columns:
    """Column buffers for tensor records (one append per tensor, no per-field dicts)."""

    def __init__(self) -> None:
        self.seq: list[int] = []
        self.node: list[str] = []
        self.kind: list[str] = []
        self.direction: list[str] = []
        self.slot: list[str] = []
        self.index: list[str] = []
        self.dtype: list[Any] = []
        self.shape: list[Any] = []
        self.max: list[Any] = []
        self.min: list[Any] = []
        self.mean: list[Any] = []
        self.norm: list[Any] = []
        self.hash: list[Any] = []
        self.file: list[Any] = []
        self.requires_grad: list[Any] = []
        self.value: list[Any] = []

    def add(self, seq: int, node: str, kind: str, direction: str, slot: str, index: str,
            obj: Any) -> None:
        self.seq.append(seq)
        self.node.append(node)
        self.kind.append(kind)
        self.direction.append(direction)
        self.slot.append(slot)
        self.index.append(index)
        if isinstance(obj, dict) and ("dtype" in obj or "Max" in obj or "shape" in obj):
            self.dtype.append(obj.get("dtype"))
            shape = obj.get("shape")
            self.shape.append(shape if isinstance(shape, list) else None)
            self.max.append(obj.get("Max"))
            self.min.append(obj.get("Min"))
            self.mean.append(obj.get("Mean"))
            self.norm.append(obj.get("Norm"))
            self.hash.append(obj.get("md5"))
            self.file.append(obj.get("data_name"))
            self.requires_grad.append(obj.get("requires_grad"))
            self.value.append(None)
        else:
            self.dtype.append(obj.get("type") if isinstance(obj, dict) else None)
            for col in (self.shape, self.max, self.min, self.mean, self.norm, self.hash,
                        self.file, self.requires_grad):
                col.append(None)
            val = obj.get("value") if isinstance(obj, dict) else obj
            self.value.append(json.dumps(val, default=str))


def _walk(cols: _Columns, seq: int, node: str, kind: str, direction: str, slot: str,
          prefix: str, obj: Any) -> None:
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            _walk(cols, seq, node, kind, direction, slot, f"{prefix}.{i}" if prefix else str(i), item)
    elif isinstance(obj, dict) and "type" not in obj and "dtype" not in obj and "Max" not in obj:
        for k, item in obj.items():
            _walk(cols, seq, node, kind, direction, slot, f"{prefix}.{k}" if prefix else str(k), item)
    elif obj is not None:
        cols.add(seq, node, kind, direction, slot, prefix, obj)


_SLOTS = {"input_args": "input", "input_kwargs": "kwarg", "output": "output",
          "parameters": "parameter", "input": "input"}


def _flatten(data: dict, path: Path) -> _Columns:
    cols = _Columns()
    add = cols.add
    for seq, (name, entry) in enumerate(data.items()):
        if not isinstance(entry, dict):
            raise ProbeError(f"{path}: entry {name!r} is a {type(entry).__name__}, not an object; "
                             "this is not an msprobe dump.json")
        kind, _, _, direction, _ = parse_node_name(name)
        if direction == "parameters_grad":
            for pname, val in entry.items():
                _walk(cols, seq, name, kind, "backward", "parameter_grad", pname, val[0]
                      if isinstance(val, list) and len(val) == 1 else val)
            continue
        for key, val in entry.items():
            slot = _SLOTS.get(key)
            if slot is None:
                continue
            if slot in ("input", "output") and isinstance(val, list):
                for i, item in enumerate(val):
                    if isinstance(item, dict) and "dtype" in item:
                        add(seq, name, kind, direction, slot, str(i), item)
                    else:
                        _walk(cols, seq, name, kind, direction, slot, str(i), item)
            elif isinstance(val, dict):
                for k, item in val.items():
                    if isinstance(item, dict) and "dtype" in item:
                        add(seq, name, kind, direction, slot, k, item)
                    else:
                        _walk(cols, seq, name, kind, direction, slot, k, item)
            else:
                _walk(cols, seq, name, kind, direction, slot, "", val)
    return cols


def _stack_refs(stack: Any) -> dict[str, str]:
    refs: dict[str, str] = {}
    if not isinstance(stack, dict):
        return refs
    for key, val in stack.items():
        if isinstance(val, list) and len(val) == 2 and isinstance(val[0], list):
            for n in val[0]:
                if isinstance(n, str):
                    refs[n] = key
        else:
            refs[key] = key
    return refs


def _node_table(names: list[str], construct: dict, stack_refs: dict[str, str], run: str,
                rank: int | None) -> pa.Table:
    order = {n: i for i, n in enumerate(names)}
    all_names = list(names)
    for n in construct:
        if n not in order:
            order[n] = len(all_names)
            all_names.append(n)
    depth_memo: dict[str, int] = {}

    def depth(n: str) -> int:
        chain = []
        cur = n
        while cur is not None and cur not in depth_memo and len(chain) < 10_000:
            chain.append(cur)
            cur = construct.get(cur)
        base = depth_memo.get(cur, -1) if cur is not None else -1
        for c in reversed(chain):
            base += 1
            depth_memo[c] = base
        return depth_memo[n]

    parents, classes, depths, stacks = [], [], [], []
    for n in all_names:
        p = construct.get(n)
        parents.append(p if isinstance(p, str) else None)
        kind, prefix, body, _, _ = parse_node_name(n)
        classes.append(body.rsplit(".", 1)[-1] if kind == "module" else f"{prefix}.{body}")
        depths.append(depth(n) if n in construct else 0)
        stacks.append(stack_refs.get(n))
    return table_from_columns("node", {
        "run": [run] * len(all_names), "rank": [rank] * len(all_names), "node": all_names,
        "parent": parents, "class_name": classes, "depth": depths,
        "order": [order[n] for n in all_names], "stack_ref": stacks})


def read_msprobe_dump(path: str | os.PathLike, run: str | None = None) -> MsprobeDump:
    """Read one msprobe dump (a dump.json, or the folder holding it) into record tables.

    construct.json and stack.json are read from beside dump.json when present. Raises
    :class:`probe.errors.ProbeError` with one line naming the file for anything unreadable.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "dump.json"
    if not path.exists():
        raise ProbeError(f"{path}: no such file")
    doc = _load_json(path, "dump.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise ProbeError(f"{path}: not an msprobe dump.json (expected an object with a 'data' "
                         "object of named entries)")
    data = doc["data"]
    if not data:
        raise ProbeError(f"{path}: empty dump (its 'data' holds no entries); check the dump's "
                         "step/rank selection and scope")
    construct: dict = {}
    cpath = path.parent / "construct.json"
    if cpath.exists():
        c = _load_json(cpath, "construct.json")
        if not isinstance(c, dict):
            raise ProbeError(f"{cpath}: not an msprobe construct.json (expected an object "
                             "mapping each node to its parent)")
        construct = c
    stack_refs: dict[str, str] = {}
    spath = path.parent / "stack.json"
    if spath.exists():
        try:
            stack_refs = _stack_refs(_load_json(spath, "stack.json"))
        except ProbeError:
            stack_refs = {}
    step, rank = _step_rank(path.resolve())
    run = run if run is not None else str(path)
    cols = _flatten(data, path)
    n = len(cols.seq)
    shapes = cols.shape
    numel = []
    for s in shapes:
        if s is None:
            numel.append(None)
        else:
            k = 1
            for d in s:
                k *= d if isinstance(d, int) else 1
            numel.append(k)
    dump_dir = doc.get("dump_data_dir")
    files = cols.file
    if dump_dir and any(files):
        base = Path(dump_dir)
        if not base.is_absolute() or not base.exists():
            base = path.parent / "dump_tensor_data"
        files = [str(base / f) if f else None for f in files]
    tensors = table_from_columns("tensor", {
        "run": [run] * n, "rank": [rank] * n, "step": [step] * n, "seq": cols.seq,
        "node": cols.node, "node_kind": cols.kind, "direction": cols.direction,
        "slot": cols.slot, "index": cols.index,
        "dtype": [d if isinstance(d, str) else None for d in cols.dtype],
        "shape": shapes, "numel": numel,
        "max": _floats(cols.max), "min": _floats(cols.min),
        "mean": _floats(cols.mean), "l2norm": _floats(cols.norm),
        "hash": cols.hash, "tensor_file": files, "requires_grad": cols.requires_grad,
        "value": cols.value,
    })
    nodes = _node_table(list(data), construct, stack_refs, run, rank)
    return MsprobeDump(path=str(path), tensors=tensors, nodes=nodes,
                       framework=doc.get("framework"), task=doc.get("task"),
                       level=doc.get("level"), step=step, rank=rank,
                       dump_data_dir=dump_dir, meta={k: v for k, v in doc.items() if k != "data"})
