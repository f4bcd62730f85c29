"""Flatten a dump.json's ``data`` (entries of tensor lists and maps) into one row per tensor.

The general path of :mod:`probe.collectors.msprobe_reader`, taken when the native scanner
(:mod:`probe.collectors.msprobe_scan`) does not read a file: the common layout (flat lists and maps of
tensors, parameter gradients) is converted in C++ by Arrow, anything else (nested outputs,
non-tensor arguments, odd values) by a Python walk. Both give the table the scanner gives:
columns ``seq`` (the entry's position), ``slot``, ``index``, ``stats`` (a
:data:`probe.collectors.msprobe_layout.STAT_TYPE` struct) and ``value`` (the JSON text of a non-tensor
argument).

>>> t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0}
>>> flat = flatten_entries({"Module.fc.Linear.forward.0": {"input_args": [t], "output": [[t, 3]]}},
...                        Path("dump.json"))
>>> flat.column("index").to_pylist(), flat.column("value").to_pylist()
(['0', '0.0', '0.1'], [None, None, '3'])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute below

from probe.collectors.msprobe_layout import SLOTS, STAT_TYPE, position_names
from probe.ground.errors import ProbeError

__all__ = ["flatten_entries"]

_ENTRY_TYPE = pa.struct([
    ("input_args", pa.list_(STAT_TYPE)), ("input_kwargs", pa.map_(pa.string(), STAT_TYPE)),
    ("output", pa.list_(STAT_TYPE)), ("parameters", pa.map_(pa.string(), STAT_TYPE)),
    ("input", pa.list_(STAT_TYPE)),
])
_PGRAD_TYPE = pa.map_(pa.string(), pa.list_(STAT_TYPE))
_EMPTY: dict = {}


def flatten_entries(data: dict, path: Path) -> pa.Table:
    """Every tensor and non-tensor argument of the entries in ``data`` (dump.json's ``data``
    object, read from ``path``), one row each, in entry order. Raises
    :class:`probe.ground.errors.ProbeError` naming ``path`` and the entry for an entry that is not an
    object, a shape that is not a list of integers in int64's range, a statistic beyond a
    float's range, or nesting too deep to walk."""
    try:
        return _flatten_fast(list(data), list(data.values())) or _flatten(data, path).table(path)
    except RecursionError:
        raise ProbeError(f"{path}: an entry nests too deeply to be an msprobe dump.json") from None


#: The largest shape dimension (and element count) a tensor record holds: int64's.
MAX_DIM = (1 << 63) - 1


def _f(v: Any) -> float | None:
    """A statistic as a float (None when it is not a number); OverflowError when it is an
    integer beyond a float's range."""
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


def _dims(shape: Any) -> list[int | None] | None:
    """A shape as a list of ints (None dims kept), as Arrow converts it; ValueError naming the
    problem for anything that is not a list of integers in int64's range."""
    if shape is None:
        return None
    if not isinstance(shape, list):
        raise ValueError(f"shape {_short(shape)} is not a list")
    out: list[int | None] = []
    for x in shape:
        if x is None:
            out.append(None)
        elif isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"shape {_short(shape)} holds {_short(x)}, not an integer")
        elif x != x or not -MAX_DIM <= x <= MAX_DIM:
            raise ValueError(f"shape {_short(shape)} holds {_short(x)}, out of range")
        else:
            out.append(int(x))
    return out


def _short(v: Any) -> str:
    """``v`` as JSON, cut to 60 characters (for a one-line error)."""
    text = json.dumps(v, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _stats_array(items: list[dict], nodes: list[str], path: Path) -> pa.StructArray:
    """The tensors' fields as one Arrow struct array (converted in C++; slow path on odd values,
    where a value out of range is a :class:`ProbeError` naming ``path`` and the entry, from
    ``nodes``)."""
    try:
        return pa.array(items, type=STAT_TYPE)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass

    def clean(d: dict, node: str) -> dict:
        out = {}
        try:
            for f in STAT_TYPE:
                v = d.get(f.name)
                if f.name in ("Max", "Min", "Mean", "Norm"):
                    v = _f(v)
                elif f.name == "shape":
                    v = _dims(v)
                elif f.name == "requires_grad":
                    v = v if isinstance(v, bool) else None
                elif f.name == "tensor_id":
                    v = v if type(v) is int and -MAX_DIM - 1 <= v <= MAX_DIM else None
                elif v is not None and not isinstance(v, str):
                    v = str(v)
                out[f.name] = v
        except (ValueError, OverflowError) as e:
            why = str(e) if isinstance(e, ValueError) else f"{f.name} is beyond a float's range"
            raise ProbeError(f"{path}: entry {node!r}: {why}; this dump.json is corrupt, re-run "
                             "the dump or give another file") from None
        return out
    return pa.array([clean(d, node) for d, node in zip(items, nodes)], type=STAT_TYPE)


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

    def table(self, path: Path) -> pa.Table:
        """The flattened tensors as a table: seq, slot, index, stats (struct), value."""
        return pa.table({"seq": pa.array(self.seq, type=pa.int64()),
                         "slot": pa.array(self.slot, type=pa.string()),
                         "index": pa.array(self.index, type=pa.string()),
                         "stats": _stats_array(self.items, self.node, path),
                         "value": pa.array(self.value, type=pa.string())})

    def _add(self, seq: int, node: str, slot: str, index: str, item: dict, value: str | None) -> None:
        self.seq.append(seq)
        self.node.append(node)
        self.slot.append(slot)
        self.index.append(index)
        self.items.append(item)
        self.value.append(value)


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
    for field_name, slot in SLOTS.items():
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
            part(fwd, offsets, slot, position_names(int(pos.max(initial=0)) + 1).take(pos), flat)
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


def _flatten(data: dict, path: Path) -> _Flat:
    flat = _Flat()
    seqs, nodes, slots, index, items, values = (flat.seq, flat.node, flat.slot, flat.index,
                                                flat.items, flat.value)
    walk = flat.walk
    slot_of = SLOTS.get
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
