"""Read msprobe-format dumps (dump.json, construct.json, stack.json) into tensor and node records.

msprobe writes one folder per step and process, ``step{N}/rank{R}/`` (or ``proc<pid>`` when no
distributed group was initialised), holding ``dump.json`` (the statistics of every tensor at
every module/API boundary), ``construct.json`` (each node's parent) and ``stack.json`` (call
stacks). This reader takes them as msprobe wrote them: ``NaN``, ``Infinity`` and ``-Infinity``
literals, PyTorch or MindSpore names and dtype strings, statistics, md5 and tensor tasks.

The common layout (tensor lists and maps, parameter gradients) is read by a native scanner
(:mod:`collectors.msprobe_scan`) straight into Arrow; anything else, and a malformed file, is
read here with orjson and a Python walk, which gives the same records (and the error message).

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

import gc
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute below

from collectors.records import table_from_columns

try:
    import orjson as _orjson
except ImportError:  # the standard library parser is the fallback
    _orjson = None
from ground.errors import ProbeError

__all__ = ["MsprobeDump", "read_msprobe_dump", "parse_node_name", "find_dump_files", "find_dump"]

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
    stacks: dict[str, list[str]] = field(default_factory=dict)   # stack_ref -> stack lines


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


def find_dump(path: str | os.PathLike, step: int | None = None, rank: int | None = None) -> Path:
    """The ``dump.json`` named by ``path``: the file itself, or the one of ``step`` and ``rank``
    under a folder (a rank, step or dump root; the lowest step, then rank, when not given).

    >>> find_dump("OUT", step=2, rank=1)                 # doctest: +SKIP
    PosixPath('OUT/step2/rank1/dump.json')
    """
    p = Path(path)
    if not p.exists():
        raise ProbeError(f"{p}: no such dump; give a dump.json file or a dump folder")
    files = find_dump_files(p)
    if not files:
        raise ProbeError(f"{p}: no dump.json found (expected step<N>/rank<R>/dump.json under it)")
    picked = [f for f in files if step in (None, _step_rank(f)[0]) and rank in (None, _step_rank(f)[1])]
    if not picked:
        found = ", ".join(str(f.relative_to(p).parent) for f in files[:8])
        raise ProbeError(f"{p}: no dump of step {step} rank {rank} (found {found})")
    return picked[0]


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


def _loads(text: bytes) -> Any:
    """Parse JSON; orjson when available, the standard library when orjson refuses the text
    (it rejects the NaN/Infinity literals that the standard library reads as msprobe writes them)."""
    if _orjson is not None:
        try:
            return _orjson.loads(text)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ProbeError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not text.strip():
        raise ProbeError(f"{path}: the {what} is empty (0 bytes of JSON)")
    return text


def _load_json(path: Path, what: str, text: bytes | None = None) -> Any:
    if text is None:
        text = _read_bytes(path, what)
    try:
        return _loads(text)
    except json.JSONDecodeError as e:
        end = "truncated" if e.pos >= len(text.rstrip()) - 1 else "malformed"
        raise ProbeError(f"{path}: {end} JSON in the {what} at line {e.lineno} column {e.colno} "
                         f"({e.msg}); re-run the dump or give another file") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise ProbeError(f"{path}: unreadable {what} ({type(e).__name__})") from None


def _f(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


_STAT_TYPE = pa.struct([
    ("type", pa.string()), ("dtype", pa.string()), ("shape", pa.list_(pa.int64())),
    ("Max", pa.float64()), ("Min", pa.float64()), ("Mean", pa.float64()), ("Norm", pa.float64()),
    ("md5", pa.string()), ("data_name", pa.string()), ("requires_grad", pa.bool_()),
])
_EMPTY: dict = {}


def _stats_array(items: list[dict]) -> pa.StructArray:
    """The tensors' fields as one Arrow struct array (converted in C++; slow path on odd values)."""
    try:
        return pa.array(items, type=_STAT_TYPE)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass

    def clean(d: dict) -> dict:
        out = {}
        for f in _STAT_TYPE:
            v = d.get(f.name)
            if f.name in ("Max", "Min", "Mean", "Norm"):
                v = _f(v)
            elif f.name == "shape":
                v = [int(x) for x in v if isinstance(x, (int, float))] if isinstance(v, list) else None
            elif f.name == "requires_grad":
                v = v if isinstance(v, bool) else None
            elif v is not None and not isinstance(v, str):
                v = str(v)
            out[f.name] = v
        return out
    return pa.array([clean(d) for d in items], type=_STAT_TYPE)


_SLOTS = {"input_args": "input", "input_kwargs": "kwarg", "output": "output",
          "parameters": "parameter", "input": "input"}


class _Flat:
    """Parallel lists, one element per tensor or argument; tensor dicts are kept by reference."""

    __slots__ = ("seq", "node", "slot", "index", "items", "value")

    def __init__(self) -> None:
        self.seq: list[int] = []
        self.node: list[str] = []
        self.slot: list[str] = []
        self.index: list[str] = []
        self.items: list[dict] = []
        self.value: list[str | None] = []

    def walk(self, seq: int, node: str, slot: str, prefix: str, obj: Any) -> None:
        if isinstance(obj, dict) and ("dtype" in obj or "Max" in obj or "shape" in obj):
            self._add(seq, node, slot, prefix, obj, None)
        elif isinstance(obj, list):
            for i, item in enumerate(obj):
                self.walk(seq, node, slot, f"{prefix}.{i}" if prefix else str(i), item)
        elif isinstance(obj, dict) and "type" not in obj:
            for k, item in obj.items():
                self.walk(seq, node, slot, f"{prefix}.{k}" if prefix else str(k), item)
        elif obj is not None:
            val = obj.get("value") if isinstance(obj, dict) else obj
            self._add(seq, node, slot, prefix, {"type": obj.get("type")} if isinstance(obj, dict)
                      else _EMPTY, json.dumps(val, default=str))

    def table(self) -> pa.Table:
        """The flattened tensors as a table: seq, slot, index, stats (struct), value."""
        return pa.table({"seq": pa.array(self.seq, type=pa.int64()),
                         "slot": pa.array(self.slot, type=pa.string()),
                         "index": pa.array(self.index, type=pa.string()),
                         "stats": _stats_array(self.items),
                         "value": pa.array(self.value, type=pa.string())})

    def _add(self, seq: int, node: str, slot: str, index: str, item: dict, value: str | None) -> None:
        self.seq.append(seq)
        self.node.append(node)
        self.slot.append(slot)
        self.index.append(index)
        self.items.append(item)
        self.value.append(value)


_ENTRY_TYPE = pa.struct([
    ("input_args", pa.list_(_STAT_TYPE)), ("input_kwargs", pa.map_(pa.string(), _STAT_TYPE)),
    ("output", pa.list_(_STAT_TYPE)), ("parameters", pa.map_(pa.string(), _STAT_TYPE)),
    ("input", pa.list_(_STAT_TYPE)),
])
_PGRAD_TYPE = pa.map_(pa.string(), pa.list_(_STAT_TYPE))
_FAST_SLOTS = (("input_args", "input"), ("input_kwargs", "kwarg"), ("output", "output"),
               ("parameters", "parameter"), ("input", "input"))


def _flatten_fast(names: list[str], values: list) -> pa.Table | None:
    """The common layout (flat lists and dicts of tensors) converted in C++ by Arrow.

    Returns None when a dump holds anything else (nested outputs, non-tensor arguments, odd
    values), which the Python walk (:func:`_flatten`) then reads.
    """
    import numpy as np

    fwd_i, pg_i = [], []
    for i, name in enumerate(names):
        (pg_i if ".parameters_grad" in name else fwd_i).append(i)
    try:
        ent = pa.array([values[i] for i in fwd_i], type=_ENTRY_TYPE)
        pg = pa.array([values[i] for i in pg_i], type=_PGRAD_TYPE)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
            OverflowError, ValueError):
        return None
    parts = []

    def part(seqs: "np.ndarray", offsets: "np.ndarray", slot: str, index: pa.Array, stats: pa.Array) -> None:
        parents = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        parts.append(pa.table({"seq": pa.array(seqs[parents], type=pa.int64()),
                               "slot": pa.array([slot] * len(stats), type=pa.string()),
                               "index": index, "stats": stats}))
    fwd = np.asarray(fwd_i, dtype=np.int64)
    for field_name, slot in _FAST_SLOTS:
        col = ent.field(field_name)
        offsets = col.offsets.to_numpy(zero_copy_only=False)
        if offsets[0] != 0:
            return None
        if isinstance(col, pa.MapArray):
            part(fwd, offsets, slot, col.keys, col.items)
        else:
            flat = col.flatten()
            parents = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
            pos = np.arange(len(flat)) - offsets[:-1][parents]
            part(fwd, offsets, slot, _position_names(int(pos.max(initial=0)) + 1).take(pos), flat)
    if len(pg):
        offsets = pg.offsets.to_numpy(zero_copy_only=False)
        lists = pg.items
        if offsets[0] != 0 or pa.compute.any(pa.compute.not_equal(pa.compute.list_value_length(lists), 1)).as_py():
            return None
        part(np.asarray(pg_i, dtype=np.int64), offsets, "parameter_grad", pg.keys, lists.flatten())
    table = pa.concat_tables(parts) if parts else pa.table({"seq": pa.array([], pa.int64())})
    stats = table.column("stats").combine_chunks()
    valid = stats.is_valid()
    if stats.null_count:
        table = table.filter(valid)
        stats = table.column("stats").combine_chunks()
    if pa.compute.any(pa.compute.and_(pa.compute.is_null(stats.field("dtype")),
                                      pa.compute.is_valid(stats.field("type")))).as_py():
        return None
    order = pa.compute.sort_indices(table, sort_keys=[("seq", "ascending")])
    table = table.take(order)
    return table.append_column("value", pa.nulls(table.num_rows, type=pa.string()))


def _constant(value: Any, n: int, type: pa.DataType) -> pa.Array:
    """``n`` copies of ``value`` (built in Arrow, not from a Python list)."""
    import numpy as np

    return pa.array([value], type=type).take(np.zeros(n, dtype=np.int32))


def _position_names(n: int) -> pa.Array:
    """``["0", "1", ..., str(n - 1)]`` as an Arrow array (positions are taken from it)."""
    return pa.array([str(i) for i in range(n)], type=pa.string())


def _numel(shape: pa.Array) -> pa.Array:
    """Product of each shape (``[]`` → 1, null → null), vectorised."""
    import numpy as np

    if isinstance(shape, pa.ChunkedArray):
        shape = shape.combine_chunks()
    n = len(shape)
    offsets = shape.offsets.to_numpy(zero_copy_only=False)
    vals = shape.flatten().fill_null(1).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.diff(offsets)
    out = np.ones(n, dtype=np.int64)
    nonempty = lengths > 0
    if nonempty.any():
        starts = (offsets[:-1] - offsets[0])[nonempty]
        out[nonempty] = np.multiply.reduceat(vals, starts)
    return pa.array(out, type=pa.int64(), mask=shape.is_null().to_numpy(zero_copy_only=False))


def _flatten(data: dict, path: Path) -> _Flat:
    flat = _Flat()
    seqs, nodes, slots, index, items, values = (flat.seq, flat.node, flat.slot, flat.index,
                                                flat.items, flat.value)
    walk = flat.walk
    slot_of = _SLOTS.get
    for seq, (name, entry) in enumerate(data.items()):
        if type(entry) is not dict:
            raise ProbeError(f"{path}: entry {name!r} is a {type(entry).__name__}, not an object; "
                             "this is not an msprobe dump.json")
        if ".parameters_grad" in name:
            for pname, val in entry.items():
                walk(seq, name, "parameter_grad", pname,
                     val[0] if isinstance(val, list) and len(val) == 1 else val)
            continue
        for key, val in entry.items():
            slot = slot_of(key)
            if slot is None:
                continue
            if type(val) is list:
                for i, item in enumerate(val):
                    if type(item) is dict and "dtype" in item:
                        seqs.append(seq)
                        nodes.append(name)
                        slots.append(slot)
                        index.append(str(i))
                        items.append(item)
                        values.append(None)
                    else:
                        walk(seq, name, slot, str(i), item)
            elif type(val) is dict:
                for k, item in val.items():
                    if type(item) is dict and "dtype" in item:
                        seqs.append(seq)
                        nodes.append(name)
                        slots.append(slot)
                        index.append(k)
                        items.append(item)
                        values.append(None)
                    else:
                        walk(seq, name, slot, k, item)
            else:
                walk(seq, name, slot, "", val)
    return flat


def _classify(names: list[str]) -> pa.Table:
    """kind, direction and class name of every entry name (vectorised over the names' dot
    separated parts; names of neither msprobe form are read by :func:`parse_node_name`).

    Module names are ``(Module|Cell).<path.Class>.(forward|backward|parameters_grad).<call>``,
    API names ``<Prefix>.<api>.<call>.(forward|backward)``.
    """
    import numpy as np
    import pyarrow.compute as pc

    arr = pa.array(names, type=pa.string())
    parts = pc.split_pattern(arr, ".")
    ends = parts.offsets.to_numpy(zero_copy_only=False)
    values = parts.values

    def from_end(k: int) -> pa.Array:
        return values.take(np.maximum(ends[1:] - k, ends[:-1]))
    first, last, second, third = values.take(ends[:-1]), from_end(1), from_end(2), from_end(3)
    length = pc.utf8_length
    body_len = pc.subtract(pc.subtract(pc.subtract(length(arr), length(first)),
                                       pc.add(length(second), length(last))), 3)
    shaped = pc.and_(pa.array(np.diff(ends) >= 4), pc.greater(body_len, 0))
    is_mod = pc.and_(shaped, pc.and_(pc.is_in(first, pa.array(list(_MODULE_PREFIXES))),
                                     pc.and_(pc.is_in(second, pa.array(["forward", "backward", "parameters_grad"])),
                                             pc.match_substring_regex(last, "^[0-9]+$"))))
    is_api = pc.and_(pc.and_(shaped, pc.greater(length(first), 0)),
                     pc.and_(pc.match_substring_regex(second, "^[0-9]+$"),
                             pc.is_in(last, pa.array(["forward", "backward"]))))
    kind = pc.if_else(is_mod, "module", pc.if_else(pc.equal(first, "Distributed"), "comm", "api"))
    direction = pc.if_else(pc.equal(pc.if_else(is_mod, second, last), "forward"), "forward", "backward")
    cls = pc.if_else(is_mod, third, pa.nulls(len(arr), pa.string()))
    api_rows = pc.indices_nonzero(pc.and_(is_api, pc.invert(is_mod)))
    if len(api_rows):
        api_cls = pc.replace_substring_regex(arr.take(api_rows), r"\.[^.]*\.[^.]*$", "")
        mask = np.zeros(len(arr), dtype=bool)
        mask[api_rows.to_numpy()] = True
        cls = pc.replace_with_mask(cls, pa.array(mask), api_cls)
    table = pa.table({"kind": kind, "direction": direction, "cls": cls})
    odd = pc.indices_nonzero(pc.invert(pc.or_(is_mod, is_api))).to_pylist()
    if odd:
        cols = {k: table.column(k).to_pylist() for k in table.column_names}
        for i in odd:
            k, prefix, body, d, _ = parse_node_name(names[i])
            cols["kind"][i] = k
            cols["direction"][i] = "forward" if d == "forward" else "backward"
            cols["cls"][i] = body.rsplit(".", 1)[-1] if k == "module" else f"{prefix}.{body}"
        table = pa.table({k: pa.array(v, type=pa.string()) for k, v in cols.items()})
    return table


def _stack_refs(stack: Any) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Node -> stack ref and ref -> stack lines: msprobe writes ``{"0": [[names], [lines]]}``,
    older dumps ``{name: lines}``."""
    refs: dict[str, str] = {}
    lines: dict[str, list[str]] = {}
    if not isinstance(stack, dict):
        return refs, lines
    for key, val in stack.items():
        if isinstance(val, list) and len(val) == 2 and isinstance(val[0], list):
            for n in val[0]:
                if isinstance(n, str):
                    refs[n] = key
            val = val[1]
        else:
            refs[key] = key
        if isinstance(val, list):
            lines[key] = [str(x) for x in val]
    return refs, lines


def _depths(construct: dict) -> dict[str, int]:
    """Depth of every node of construct.json (roots 0), following parent links once each."""
    memo: dict[str, int] = {}
    for start, parent in construct.items():
        if start in memo:
            continue
        if parent is None:
            memo[start] = 0
            continue
        chain = [start]
        cur = parent
        while isinstance(cur, str) and cur not in memo and len(chain) < 10_000:
            chain.append(cur)
            cur = construct.get(cur)
        base = memo.get(cur, -1) if isinstance(cur, str) else -1
        for node in reversed(chain):
            base += 1
            memo[node] = base
    return memo


def _node_table(names: list[str], classes: pa.Array, construct: dict,
                stack_refs: dict[str, str], run: str, rank: int | None) -> pa.Table:
    """The node records: every entry, then the construct.json nodes without an entry; parents,
    depths, execution order and stack references looked up in Arrow (no loop per node)."""
    import numpy as np
    import pyarrow.compute as pc

    known = set(names)
    extra = [x for x in construct if x not in known]
    node = pa.array(names + extra, type=pa.string())
    cls = pa.concat_arrays([classes.cast(pa.string()),
                            _classify(extra).column("cls").combine_chunks()]) if extra else classes
    n = len(node)
    # construct.json, in its order (calls as they start): parent and depth of each node
    keys = pa.array(list(construct), type=pa.string())
    where = pc.index_in(node, value_set=keys)                 # position in construct, or null
    parents = [p if isinstance(p, str) else None for p in construct.values()]
    depth_of = _depths(construct)
    depths = pa.array([depth_of.get(x, 0) for x in construct], type=pa.int32())
    parent = pa.array(parents, type=pa.string()).take(where) if len(keys) else pa.nulls(n, pa.string())
    depth = pc.fill_null(depths.take(where), 0) if len(keys) else pa.array(np.zeros(n, np.int32))
    # execution order: construct.json's, then the entries it lacks in dump order
    order = pc.fill_null(where.cast(pa.int64()),
                         pa.array(np.arange(len(keys), len(keys) + n, dtype=np.int64)))
    if stack_refs:
        ref_keys = pa.array(list(stack_refs), type=pa.string())
        stack_ref = pa.array(list(stack_refs.values()), type=pa.string()).take(
            pc.index_in(node, value_set=ref_keys))
    else:
        stack_ref = pa.nulls(n, pa.string())
    return table_from_columns("node", {
        "run": _constant(run, n, pa.string()), "rank": _constant(rank, n, pa.int32()),
        "node": node, "parent": parent, "class_name": cls, "depth": depth, "order": order,
        "stack_ref": stack_ref})


def read_msprobe_dump(path: str | os.PathLike, run: str | None = None) -> MsprobeDump:
    """Read one msprobe dump (a dump.json, or the folder holding it) into record tables.

    construct.json and stack.json are read from beside dump.json when present. Raises
    :class:`ground.errors.ProbeError` with one line naming the file for anything unreadable.
    """
    with _gc_paused():
        return _read_msprobe_dump(path, run)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused: parsing a dump creates millions of dicts and
    lists (none of them cyclic), and every collection it would trigger walks all of them again,
    which makes reading a large dump about twice as slow."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_msprobe_dump(path: str | os.PathLike, run: str | None) -> MsprobeDump:
    path = Path(path)
    if path.is_dir():
        path = path / "dump.json"
    if not path.exists():
        raise ProbeError(f"{path}: no such file")
    raw = _read_bytes(path, "dump.json")
    from collectors.msprobe_scan import scan_dump

    scanned = scan_dump(raw)                 # the common layout, natively; else the general path
    if scanned is not None:
        meta, names, flat = scanned.meta, scanned.names.to_pylist(), scanned.flat
    else:
        doc = _load_json(path, "dump.json", raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            raise ProbeError(f"{path}: not an msprobe dump.json (expected an object with a 'data' "
                             "object of named entries)")
        data = doc["data"]
        if not data:
            raise ProbeError(f"{path}: empty dump (its 'data' holds no entries); check the dump's "
                             "step/rank selection and scope")
        meta = {k: v for k, v in doc.items() if k != "data"}
        names = list(data)
        flat = _flatten_fast(names, list(data.values())) or _flatten(data, path).table()
        del doc, data
    del raw
    construct: dict = {}
    cpath = path.parent / "construct.json"
    if cpath.exists():
        c = _load_json(cpath, "construct.json")
        if not isinstance(c, dict):
            raise ProbeError(f"{cpath}: not an msprobe construct.json (expected an object "
                             "mapping each node to its parent)")
        construct = c
    stack_refs: dict[str, str] = {}
    stacks: dict[str, list[str]] = {}
    spath = path.parent / "stack.json"
    if spath.exists():
        try:
            stack_refs, stacks = _stack_refs(_load_json(spath, "stack.json"))
        except ProbeError:
            pass
    step, rank = _step_rank(path.resolve())
    run = run if run is not None else str(path)
    info = _classify(names)
    seq = flat.column("seq")
    stats = flat.column("stats").combine_chunks() if isinstance(flat.column("stats"), pa.ChunkedArray) \
        else flat.column("stats")
    n = flat.num_rows
    shape = stats.field("shape")
    numel = _numel(shape)
    files = stats.field("data_name")
    dump_dir = meta.get("dump_data_dir")
    if files.null_count < n:
        base = Path(dump_dir) if dump_dir else path.parent / "dump_tensor_data"
        if not base.is_absolute() or not base.exists():
            base = path.parent / "dump_tensor_data"
        files = pa.array([str(base / f) if f else None for f in files.to_pylist()], type=pa.string())
    dtype = pa.compute.coalesce(stats.field("dtype"), stats.field("type"))
    tensors = table_from_columns("tensor", {
        "run": _constant(run, n, pa.string()), "rank": _constant(rank, n, pa.int32()),
        "step": _constant(step, n, pa.int64()), "seq": seq,
        "node": pa.array(names, type=pa.string()).take(seq),
        "node_kind": info.column("kind").take(seq), "direction": info.column("direction").take(seq),
        "slot": flat.column("slot"), "index": flat.column("index"),
        "dtype": dtype, "shape": shape, "numel": numel,
        "max": stats.field("Max"), "min": stats.field("Min"), "mean": stats.field("Mean"),
        "l2norm": stats.field("Norm"), "hash": stats.field("md5"), "tensor_file": files,
        "requires_grad": stats.field("requires_grad"),
        "value": flat.column("value"), "nan_count": pa.nulls(n, pa.int64()),
        "inf_count": pa.nulls(n, pa.int64()), "host_ts_ns": pa.nulls(n, pa.int64()),
    })
    nodes = _node_table(names, info.column("cls").combine_chunks(), construct, stack_refs, run, rank)
    return MsprobeDump(path=str(path), tensors=tensors, nodes=nodes,
                       framework=meta.get("framework"), task=meta.get("task"),
                       level=meta.get("level"), step=step, rank=rank,
                       dump_data_dir=dump_dir, meta=meta,
                       stacks=stacks)
