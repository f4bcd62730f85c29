"""compare.csv written by a native formatter: the bytes of ``pyarrow.csv.write_csv``, faster.

Formatting the doubles is most of the cost of compare.csv (266k rows of 100k entries: 4.5M
doubles, 0.53 of the file's 0.70 s CPU with Arrow's writer). ``csv_format.cpp`` (built once
per machine, see :mod:`probe.ground.native`) formats rows of int64, double, bool and string columns
as Arrow's writer does (its default options: every string quoted, nulls empty, ``\\n``), and
list<int64> columns as the compare's CSV shows them (``"[2, 4]"``), with
std::to_chars's shortest digits (the digits Arrow's double-conversion gives). A table of any
other column type, or a machine without a C++ compiler, returns False and the caller writes
with Arrow.

>>> import pyarrow as pa, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "x.csv")
>>> ok = write_csv(pa.table({"i": [1, None], "x": [2.5e-7, None], "s": ['a"b', None]}), path)
>>> not ok or open(path).read()
'"i","x","s"\\n1,2.5e-7,"a""b"\\n,,\\n'
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["write_csv"]

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csv_format.cpp")

#: the formatter's column kinds, and the widest text of one value of each (a string's is
#: two quotes plus twice its bytes, counted per batch)
_INT64, _DOUBLE, _BOOL, _STRING, _LARGE_STRING, _LIST_INT64 = 1, 2, 3, 4, 5, 6
_WIDTH = {_INT64: 20, _DOUBLE: 32, _BOOL: 5, _STRING: 2, _LARGE_STRING: 2, _LIST_INT64: 4}

#: Rows formatted per call (3 MB of text at 100k entries, in a buffer reused batch after
#: batch: a larger batch only raised the compare's peak memory).
BATCH_ROWS = 4_096


class _Column(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("pad", ctypes.c_int32), ("offset", ctypes.c_int64),
                ("valid", ctypes.c_void_p), ("values", ctypes.c_void_p), ("data", ctypes.c_void_p),
                ("child_valid", ctypes.c_void_p), ("child_offset", ctypes.c_int64)]


_fn: Any = None


def _formatter() -> Any:
    """The native format function, or False (no C++ compiler, ``PROBE_NATIVE=0``)."""
    global _fn
    if _fn is None:
        from probe.ground.native import load_cached

        dll = load_cached(_SOURCE, "csv-format", [["-std=c++17", "-lstdc++"]], what="the CSV formatter")
        fn = getattr(dll, "probe_csv_format", None) if dll is not None else None
        if fn is not None:
            fn.argtypes = (ctypes.POINTER(_Column), ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_void_p, ctypes.c_int64)
            fn.restype = ctypes.c_int64
        _fn = fn or False
    return _fn


def _kind(t: Any) -> int | None:
    import pyarrow as pa

    if pa.types.is_int64(t):
        return _INT64
    if pa.types.is_float64(t):
        return _DOUBLE
    if pa.types.is_boolean(t):
        return _BOOL
    if pa.types.is_string(t):
        return _STRING
    if pa.types.is_large_string(t):
        return _LARGE_STRING
    if pa.types.is_list(t) and pa.types.is_int64(t.value_type):
        return _LIST_INT64
    return None


def write_csv(table: Any, path: Any, workers: int = 1, append: bool = False) -> bool:
    """Write ``table`` to ``path`` as ``pyarrow.csv.write_csv`` would; False (nothing written)
    when a column's type or the machine has no native path. ``workers`` > 1: batches formatted
    on that many threads (ctypes lets go of the GIL), written in order. ``append``: add the rows
    at the end of ``path``, without the header (a table written a slice at a time)."""
    kinds = [_kind(f.type) for f in table.schema]
    fn = _formatter()
    if not fn or None in kinds:
        return False
    import itertools

    header = ",".join('"' + name.replace('"', '""') + '"' for name in table.column_names)
    batches = iter(table.to_batches(max_chunksize=BATCH_ROWS))
    with open(path, "ab" if append else "wb") as f:
        if not append:
            f.write(header.encode() + b"\n")
        if workers <= 1:
            buf: list = [None]                      # one buffer, reused batch after batch
            for batch in batches:
                f.write(_format(fn, batch, kinds, buf))
            return True
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="compare-csv") as pool:
            ahead = [pool.submit(_format, fn, b, kinds) for b in itertools.islice(batches, 2 * workers)]
            while ahead:
                f.write(ahead.pop(0).result())
                nxt = next(batches, None)
                if nxt is not None:
                    ahead.append(pool.submit(_format, fn, nxt, kinds))
    return True


def _format(fn: Any, batch: Any, kinds: list[int], buf: list | None = None) -> memoryview:
    """One record batch's rows as CSV text; in ``buf[0]`` (a numpy buffer, replaced when too
    small) when given, else in a buffer of its own."""
    import numpy as np

    n, ncols = batch.num_rows, batch.num_columns
    cols = (_Column * max(ncols, 1))()
    cap = n * (ncols + 1)
    for c, (arr, kind) in enumerate(zip(batch.columns, kinds)):
        bufs = arr.buffers()
        valid = bufs[0].address if bufs[0] is not None and arr.null_count else None
        data, child_valid, child_offset = None, None, 0
        if kind in (_STRING, _LARGE_STRING, _LIST_INT64):
            offsets = np.frombuffer(bufs[1], dtype=np.int64 if kind == _LARGE_STRING else np.int32,
                                    count=arr.offset + n + 1)
            span = int(offsets[arr.offset + n] - offsets[arr.offset])
            if kind == _LIST_INT64:            # an element: up to 20 digits and ", "
                child = arr.values
                cb = child.buffers()
                child_valid = cb[0].address if cb[0] is not None and child.null_count else None
                child_offset = child.offset
                data = cb[1].address if cb[1] is not None else None
                cap += 22 * span
            else:
                data = bufs[2].address if bufs[2] is not None else None
                cap += 2 * span
        cols[c] = _Column(kind, 0, arr.offset, valid, bufs[1].address if bufs[1] is not None else None, data,
                          child_valid, child_offset)
        cap += n * _WIDTH[kind]
    out = buf[0] if buf is not None and buf[0] is not None and len(buf[0]) >= cap else None
    if out is None:
        out = np.empty(max(cap, 1), dtype=np.uint8)
        if buf is not None:
            buf[0] = out
    written = fn(cols, ncols, 0, n, out.ctypes.data, cap)
    if written < 0:
        raise RuntimeError(f"native CSV formatter failed ({written})")
    return memoryview(out)[:written]
