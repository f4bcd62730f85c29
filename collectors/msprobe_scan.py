"""Read an msprobe dump.json's common layout straight into Arrow with a native scanner.

:func:`scan_dump` runs ``msprobe_scan.c`` (built once per machine, see :mod:`probe.ground.native`) over
the file's bytes: one pass that writes the entry names, the tensors' statistics, dtypes, shapes
and argument positions into Arrow buffers, with no Python object per value. It reads the
``NaN``, ``Infinity`` and ``-Infinity`` literals msprobe writes, and names and strings with
escapes (``json.dump`` writes every non-ASCII character as a ``\\u`` escape). It returns None for
anything outside the common layout (nested outputs, non-tensor arguments, escapes in the
layout's own member names, half a surrogate pair, odd value types) and for malformed text, and
the reader then takes the general path (orjson and a Python walk), which words the error for a
malformed file. Without a C compiler it always returns
None. The result is the table the reader's general path builds: the same columns, rows in the
same order.

>>> r = scan_dump(b'{"task": "statistics", "data": {"Module.fc.Linear.forward.0": '
...               b'{"output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], '
...               b'"Max": 1.0, "Min": NaN, "Mean": 0.5, "Norm": 1.1}]}}}')
>>> r is None or (r.names.to_pylist(), r.flat.column("slot").to_pylist(), r.meta)
... # doctest: +ELLIPSIS
(['Module.fc.Linear.forward.0'], ['output'], {'task': 'statistics'})
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from probe.collectors.msprobe_layout import STAT_TYPE, loads, position_names

__all__ = ["ScanResult", "scan_dump", "scan_file"]

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "msprobe_scan.c")
#: slot codes of the scanner → slot names of the tensor records (input_args and a backward
#: entry's input are both "input"); the codes are also the order of slots within an entry
_SLOT_NAMES = ("input", "kwarg", "output", "parameter", "input", "parameter_grad")
_META_CAP = 256


class _StrCol(ctypes.Structure):
    _fields_ = [("offsets", ctypes.c_void_p), ("data", ctypes.c_void_p), ("valid", ctypes.c_void_p),
                ("data_cap", ctypes.c_int64), ("data_len", ctypes.c_int64)]


class _Scan(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("len", ctypes.c_int64),
                ("ent_cap", ctypes.c_int64), ("n_ent", ctypes.c_int64), ("names", _StrCol),
                ("t_cap", ctypes.c_int64), ("n_t", ctypes.c_int64),
                ("seq", ctypes.c_void_p), ("slot", ctypes.c_void_p), ("pos", ctypes.c_void_p),
                ("keys", _StrCol), ("type", _StrCol), ("dtype", _StrCol), ("md5", _StrCol),
                ("data_name", _StrCol),
                ("stats", ctypes.c_void_p), ("stat_valid", ctypes.c_void_p),
                ("requires_grad", ctypes.c_void_p), ("shape_off", ctypes.c_void_p),
                ("shape_valid", ctypes.c_void_p), ("s_cap", ctypes.c_int64), ("n_s", ctypes.c_int64),
                ("shape_vals", ctypes.c_void_p),
                ("meta_cap", ctypes.c_int64), ("n_meta", ctypes.c_int64),
                ("meta_ranges", ctypes.c_void_p), ("err_pos", ctypes.c_int64),
                ("release", ctypes.c_int64), ("tensor_id", ctypes.c_void_p),
                ("tensor_id_valid", ctypes.c_void_p)]


_fn: Any = None


def _scanner() -> Any:
    """The native scan function, or False (no compiler, build failed, ``PROBE_NATIVE=0``)."""
    global _fn
    if _fn is not None:
        return _fn
    from probe.ground.native import load_cached

    dll = load_cached(_SOURCE, "msprobe-scan", what="the dump.json scanner")
    fn = getattr(dll, "probe_scan_msprobe", None) if dll is not None else None
    if fn is None:
        _fn = False
        return _fn
    fn.argtypes = (ctypes.POINTER(_Scan),)
    fn.restype = ctypes.c_int64
    _fn = fn
    return _fn


@dataclass
class ScanResult:
    """What :func:`scan_dump` read: entry names in file order, the flattened tensors (columns
    ``seq, slot, index, stats, value`` as the reader's general path builds them) and the
    document's other top-level members (``task``, ``level``, ``framework``, ...)."""

    names: pa.Array
    flat: pa.Table
    meta: dict


class _Col:
    """numpy buffers of one string column, sized for the worst case (pages are touched only as
    they are written, so a generous capacity costs address space, not memory)."""

    def __init__(self, rows: int, data_cap: int) -> None:
        import numpy as np

        self.offsets = np.empty(rows + 1, dtype=np.int32)
        self.data = np.empty(max(data_cap, 1), dtype=np.uint8)
        self.valid = np.empty(max(rows, 1), dtype=np.uint8)

    def struct(self) -> _StrCol:
        return _StrCol(self.offsets.ctypes.data, self.data.ctypes.data, self.valid.ctypes.data,
                       len(self.data), 0)

    def array(self, n: int, data_len: int) -> pa.Array:
        import numpy as np

        valid = self.valid[:n].view(bool)
        nulls = n - int(np.count_nonzero(valid))
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
        arr = pa.Array.from_buffers(pa.string(), n, [bitmap, pa.py_buffer(self.offsets[:n + 1]),
                                                      pa.py_buffer(self.data[:data_len])],
                                    null_count=nulls)
        arr.validate(full=True)             # UTF-8: a file that is not is read the general way
        return arr


def scan_dump(raw: bytes | mmap.mmap, *, mapped: bool = False) -> ScanResult | None:
    """The dump.json in ``raw`` (its bytes, or the file mapped: :func:`scan_file`) read by the
    native scanner, or None (see the module docstring). ``mapped``: ``raw`` is a read-only
    mapping of the file, whose pages the scanner hands back as it goes (never for bytes: their
    memory would be zeroed)."""
    fn = _scanner()
    if not fn or not len(raw):
        return None
    # capacities for a dump as msprobe writes one (a tensor takes 60 bytes or more, a shape
    # value 2 or more); a denser file overflows them and is scanned again with exact bounds
    r = _scan(fn, raw, len(raw) // 48 + 64, len(raw) // 2 + 64, mapped)
    if r is _TOO_SMALL:
        r = _scan(fn, raw, _count(raw, b"{") + 1, _count(raw, b",") + _count(raw, b"[") + 1, mapped)
    return None if r is _TOO_SMALL else r


def scan_file(path: str | os.PathLike) -> ScanResult | None:
    """:func:`scan_dump` of the file at ``path``, mapped rather than read (no copy of it in
    memory; an 800 MB dump.json is read 0.5-2 s faster); None also when it cannot be mapped
    (the reader's general path then reads it, and says why if it cannot)."""
    if not _scanner():
        return None
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as raw:
            return scan_dump(raw, mapped=True)
    except (OSError, ValueError):                      # an empty file, a folder, unreadable
        return None


def _count(raw: bytes | mmap.mmap, char: bytes) -> int:
    """How often ``char`` occurs in ``raw``, a piece at a time (no copy of all of it)."""
    step = 64 << 20
    view = memoryview(raw)
    try:
        return sum(bytes(view[i:i + step]).count(char) for i in range(0, len(raw), step))
    finally:
        view.release()


_TOO_SMALL = object()
_E_CAPACITY = -3


def _scan(fn: Any, raw: bytes | mmap.mmap, t_cap: int, s_cap: int, mapped: bool) -> Any:
    import numpy as np

    n_raw = len(raw)
    buf = np.frombuffer(raw, dtype=np.uint8)     # the bytes' address, without a copy
    names, keys = _Col(t_cap, n_raw), _Col(t_cap, n_raw)
    cols = {k: _Col(t_cap, n_raw) for k in ("type", "dtype", "md5", "data_name")}
    seq = np.empty(t_cap, dtype=np.int64)
    slot = np.empty(t_cap, dtype=np.int8)
    pos = np.empty(t_cap, dtype=np.int32)
    stats = np.empty(4 * t_cap, dtype=np.float64)
    stat_valid = np.empty(4 * t_cap, dtype=np.uint8)
    grad = np.empty(t_cap, dtype=np.int8)
    tensor_id = np.empty(t_cap, dtype=np.int64)
    tensor_id_valid = np.empty(t_cap, dtype=np.uint8)
    shape_off = np.empty(t_cap + 1, dtype=np.int32)
    shape_valid = np.empty(t_cap, dtype=np.uint8)
    shape_vals = np.empty(s_cap, dtype=np.int64)
    meta = np.empty(4 * _META_CAP, dtype=np.int64)
    s = _Scan(buf.ctypes.data, n_raw, t_cap, 0, names.struct(), t_cap, 0,
              seq.ctypes.data, slot.ctypes.data, pos.ctypes.data,
              keys.struct(), cols["type"].struct(), cols["dtype"].struct(), cols["md5"].struct(),
              cols["data_name"].struct(), stats.ctypes.data, stat_valid.ctypes.data,
              grad.ctypes.data, shape_off.ctypes.data, shape_valid.ctypes.data, s_cap, 0,
              shape_vals.ctypes.data, _META_CAP, 0, meta.ctypes.data, 0, 1 if mapped else 0,
              tensor_id.ctypes.data, tensor_id_valid.ctypes.data)
    code = fn(ctypes.byref(s))
    del buf
    if code == _E_CAPACITY:
        return _TOO_SMALL
    if code <= 0:
        return None
    try:
        return _assemble(raw, s, names, keys, cols, seq, slot, pos, stats, stat_valid, grad,
                         shape_off, shape_valid, shape_vals, meta, tensor_id, tensor_id_valid)
    except (pa.ArrowException, ValueError, TypeError, UnicodeDecodeError):
        return None                   # e.g. an older pyarrow without a call used here


def _assemble(raw: bytes | mmap.mmap, s: _Scan, names: _Col, keys: _Col, cols: dict, seq: Any, slot: Any,
              pos: Any, stats: Any, stat_valid: Any, grad: Any, shape_off: Any, shape_valid: Any,
              shape_vals: Any, meta: Any, tensor_id: Any, tensor_id_valid: Any) -> ScanResult | None:
    """The scanner's buffers as the reader's tables (None: a layout the general path reads)."""
    import numpy as np
    import pyarrow.compute as pc

    n_ent, n = s.n_ent, s.n_t
    name_arr = names.array(n_ent, s.names.data_len)      # not UTF-8: raises, read the general way
    key_arr = keys.array(n, s.keys.data_len)
    strs = {k: c.array(n, getattr(s, k).data_len) for k, c in cols.items()}
    meta_doc = _meta(raw, meta[:4 * s.n_meta].reshape(-1, 4))
    # repeated entry names or top-level members: the general path refuses them with a line
    if len(name_arr.unique()) != n_ent or len(meta_doc) != s.n_meta:
        return None
    if n and pc.any(pc.and_(strs["dtype"].is_null(), strs["type"].is_valid())).as_py():
        return None                          # a non-tensor argument: the general path reads it
    sv = stat_valid[:4 * n].reshape(-1, 4).view(bool)
    st = stats[:4 * n].reshape(-1, 4)
    g = grad[:n]
    # a null offset marks a null list (the form every pyarrow version reads)
    off_null = np.append(shape_valid[:n] == 0, False)
    shape = pa.ListArray.from_arrays(pa.array(shape_off[:n + 1], mask=off_null),
                                     pa.array(shape_vals[:s.n_s]))
    stat_arrays = {"type": strs["type"], "dtype": strs["dtype"], "shape": shape,
                   "Max": pa.array(st[:, 0], mask=~sv[:, 0]), "Min": pa.array(st[:, 1], mask=~sv[:, 1]),
                   "Mean": pa.array(st[:, 2], mask=~sv[:, 2]), "Norm": pa.array(st[:, 3], mask=~sv[:, 3]),
                   "md5": strs["md5"], "data_name": strs["data_name"],
                   "requires_grad": pa.array(g == 1, mask=g < 0),
                   "tensor_id": pa.array(tensor_id[:n], mask=tensor_id_valid[:n] == 0)}
    struct = pa.StructArray.from_arrays([stat_arrays[f.name] for f in STAT_TYPE], fields=list(STAT_TYPE))
    p = pos[:n]
    index = pc.if_else(pa.array(p >= 0),
                       position_names(int(p.max(initial=0)) + 1).take(np.maximum(p, 0)), key_arr)
    codes = slot[:n]
    table = pa.table({"seq": pa.array(seq[:n]),
                      "slot": pa.array(_SLOT_NAMES, type=pa.string()).take(codes.astype(np.int32)),
                      "index": index, "stats": struct,
                      "value": pa.nulls(n, type=pa.string())})
    key = seq[:n] * 8 + codes                # entry order, then slots in the reader's order
    if n > 1 and not bool(np.all(key[1:] >= key[:-1])):
        table = table.take(pa.array(np.argsort(key, kind="stable")))
    return ScanResult(names=name_arr, flat=table, meta=meta_doc)


def _meta(raw: bytes | mmap.mmap, ranges: Any) -> dict:
    """The top-level members other than ``data``, each value parsed from its own bytes (with the
    reader's parser: orjson, the standard library for NaN/Infinity literals)."""
    return {raw[k0:k1].decode(): loads(raw[v0:v1]) for k0, k1, v0, v1 in ranges.tolist()}
