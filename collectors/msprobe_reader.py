"""Read msprobe-format dumps (dump.json, construct.json, stack.json) into tensor and node records.

msprobe writes one folder per step and process, ``step{N}/rank{R}/`` (or ``proc<pid>`` when no
distributed group was initialised), holding ``dump.json`` (the statistics of every tensor at
every module/API boundary), ``construct.json`` (each node's parent) and ``stack.json`` (call
stacks). This reader takes them as msprobe wrote them: ``NaN``, ``Infinity`` and ``-Infinity``
literals, PyTorch or MindSpore names and dtype strings, statistics, md5 and tensor tasks.

The common layout (tensor lists and maps, parameter gradients) is read by a native scanner
(:mod:`probe.collectors.msprobe_scan`) straight into Arrow; anything else, and a malformed file, is
read here with orjson and flattened by :mod:`probe.collectors.msprobe_flatten`, which gives the same
records (and the error message). The entries' kinds and classes and the module tree come
from :mod:`probe.collectors.msprobe_nodes`; the folder layout and entry names from
:mod:`probe.collectors.msprobe_layout`.

Every bad input is one :class:`probe.ground.errors.ProbeError` line naming the file, and the entry
where there is one: binary data, JSON that is not a dump, nesting too deep to read, text that is
not Unicode, a shape that is not a list of dimensions >= 0 whose product an int64 holds, a
statistic beyond a float's range. (A float literal beyond a float's range, ``1e999``, reads as
infinite, as every JSON reader here reads it.)

A dump entry becomes tensor records (:data:`probe.collectors.records.TENSOR`), one per tensor or
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

A tensor's ``tensor_id`` (the key ``probe dump`` adds: the data's id in the step, which
msprobe's tools ignore) becomes the ``tensor_id`` column; it is null for msprobe's own dumps,
older dumps and a value that is not an integer.

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute below

from probe.collectors.msprobe_flatten import flatten_entries
from probe.collectors.msprobe_layout import DuplicateKey, loads, loads_unique, step_rank
from probe.collectors.msprobe_nodes import classify_entries, node_columns, stack_refs
from probe.collectors.msprobe_scan import scan_file
from probe.collectors.records import schema_for, table_from_columns
from probe.ground.errors import ProbeError
from probe.ground.files import check_regular, read_regular

__all__ = ["MsprobeDump", "read_msprobe_dump"]


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


def read_msprobe_dump(path: str | os.PathLike, run: str | None = None,
                      columns: Sequence[str] | None = None, node_dictionary: bool = False) -> MsprobeDump:
    """Read one msprobe dump (a dump.json, or the folder holding it) into record tables.

    construct.json and stack.json are read from beside dump.json when present. Raises
    :class:`probe.ground.errors.ProbeError` with one line naming the file for anything unreadable.

    For a reader that needs less than the whole tensor record (the compare): ``columns``, the
    tensor columns to build (in the record's order; all when None), and ``node_dictionary``,
    ``node`` dictionary-encoded: the entries' names in file order, indexed by each record's
    ``seq`` (no string per record).

    >>> d = read_msprobe_dump("run/step0/rank0", columns=["seq", "node", "max"],
    ...                       node_dictionary=True)                 # doctest: +SKIP
    >>> d.tensors.schema.field("node").type                         # doctest: +SKIP
    DictionaryType(dictionary<values=string, indices=int64, ordered=0>)
    """
    with _gc_paused():
        return _read_msprobe_dump(path, run, columns, node_dictionary)


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


def _read_msprobe_dump(path: str | os.PathLike, run: str | None, columns: Sequence[str] | None,
                       node_dictionary: bool) -> MsprobeDump:
    path = Path(path)
    if path.is_dir():
        path = path / "dump.json"
    if not path.exists():
        raise ProbeError(f"{path}: no such file")
    meta, name_arr, flat = _read_entries(path)
    names = name_arr.to_pylist()
    construct, refs, stacks = _read_tree(path)
    step, rank = step_rank(path.resolve())
    run = run if run is not None else str(path)
    info = classify_entries(names)
    tensors = _tensor_table(path, meta, name_arr, info, flat, run, rank, step, columns, node_dictionary)
    cols = node_columns(names, info.column("cls").combine_chunks(), construct, refs, path.parent / "construct.json")
    n = len(cols["node"])
    nodes = table_from_columns("node", {"run": _constant(run, n, pa.string()),
                                        "rank": _constant(rank, n, pa.int32()), **cols})
    return MsprobeDump(path=str(path), tensors=tensors, nodes=nodes,
                       framework=meta.get("framework"), task=meta.get("task"),
                       level=meta.get("level"), step=step, rank=rank,
                       dump_data_dir=meta.get("dump_data_dir"), meta=meta,
                       stacks=stacks)


def _read_entries(path: Path) -> tuple[dict, pa.Array, pa.Table]:
    """dump.json's top-level members but ``data``, its entry names in file order and its
    tensors flattened (the native scanner's table, or the general path's)."""
    check_regular(path)                      # a FIFO or a device: one line, before anything blocks
    scanned = scan_file(path)                # the common layout, natively; else the general path
    if scanned is not None:
        return scanned.meta, scanned.names, scanned.flat
    raw = _read_bytes(path, "dump.json")
    doc = _load_json(path, "dump.json", raw)
    del raw
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise ProbeError(f"{path}: not an msprobe dump.json (expected an object with a 'data' "
                         "object of named entries)")
    data = doc["data"]
    if not data:
        raise ProbeError(f"{path}: empty dump (its 'data' holds no entries); check the dump's "
                         "step/rank selection and scope")
    meta = {k: v for k, v in doc.items() if k != "data"}
    return meta, pa.array(list(data), type=pa.string()), flatten_entries(data, path)


def _read_tree(path: Path) -> tuple[dict, dict[str, str], dict[str, list[str]]]:
    """construct.json (node -> parent) and stack.json (node -> stack ref, ref -> lines) from
    beside dump.json; empty when absent, and stack.json is skipped when unreadable."""
    construct: dict = {}
    cpath = path.parent / "construct.json"
    if cpath.exists():
        c = _load_json(cpath, "construct.json")
        if not isinstance(c, dict):
            raise ProbeError(f"{cpath}: not an msprobe construct.json (expected an object "
                             "mapping each node to its parent)")
        construct = c
    refs: dict[str, str] = {}
    stacks: dict[str, list[str]] = {}
    spath = path.parent / "stack.json"
    if spath.exists():
        try:
            refs, stacks = stack_refs(_load_json(spath, "stack.json"))
        except (ProbeError, RecursionError):          # a stack nested too deeply to list
            pass
    return construct, refs, stacks


def _tensor_table(path: Path, meta: dict, names: pa.Array, info: pa.Table, flat: pa.Table,
                  run: str, rank: int | None, step: int | None, columns: Sequence[str] | None = None,
                  node_dictionary: bool = False) -> pa.Table:
    """The tensor records of the flattened tensors (``info``: the entries' kind and direction),
    of ``columns`` only when given (see :func:`read_msprobe_dump`)."""
    seq = flat.column("seq")
    stats = flat.column("stats").combine_chunks() if isinstance(flat.column("stats"), pa.ChunkedArray) \
        else flat.column("stats")
    n = flat.num_rows
    shape = stats.field("shape")
    numel, bad = _numel(shape)
    if bad is not None:
        row, why = bad
        where = f"{flat.column('slot')[row].as_py()} {flat.column('index')[row].as_py()}"
        raise ProbeError(f"{path}: entry {names[seq[row].as_py()].as_py()!r}, {where}: shape "
                         f"{shape[row].as_py()} {why}; this dump.json is corrupt, re-run the dump "
                         "or give another file")
    entry = seq.combine_chunks() if isinstance(seq, pa.ChunkedArray) else seq

    def files() -> pa.Array:
        files = stats.field("data_name")
        if files.null_count < n:
            dump_dir = meta.get("dump_data_dir")
            base = Path(dump_dir) if dump_dir else path.parent / "dump_tensor_data"
            if not base.is_absolute() or not base.exists():
                base = path.parent / "dump_tensor_data"
            # a data_name is a file name inside the data folder: one with a path in it (``../x``,
            # ``/etc/y``) is not followed, so a crafted dump.json cannot point outside it
            files = pa.array([str(base / f) if f and f == os.path.basename(f) and f not in (".", "..")
                              else None for f in files.to_pylist()], type=pa.string())
        return files

    def node() -> pa.Array:
        if node_dictionary:
            return pa.DictionaryArray.from_arrays(entry, names)
        return names.take(entry)
    build = {
        "run": lambda: _constant(run, n, pa.string()), "rank": lambda: _constant(rank, n, pa.int32()),
        "step": lambda: _constant(step, n, pa.int64()), "seq": lambda: seq, "node": node,
        "node_kind": lambda: info.column("kind").take(entry),
        "direction": lambda: info.column("direction").take(entry),
        "slot": lambda: flat.column("slot"), "index": lambda: flat.column("index"),
        "dtype": lambda: pa.compute.coalesce(stats.field("dtype"), stats.field("type")),
        "shape": lambda: shape, "numel": lambda: numel,
        "max": lambda: stats.field("Max"), "min": lambda: stats.field("Min"),
        "mean": lambda: stats.field("Mean"), "l2norm": lambda: stats.field("Norm"),
        "hash": lambda: stats.field("md5"), "tensor_file": files,
        "requires_grad": lambda: stats.field("requires_grad"),
        "tensor_id": lambda: stats.field("tensor_id"),
        "value": lambda: flat.column("value"), "nan_count": lambda: pa.nulls(n, pa.int64()),
        "inf_count": lambda: pa.nulls(n, pa.int64()), "host_ts_ns": lambda: pa.nulls(n, pa.int64()),
    }
    if columns is None and not node_dictionary:
        return table_from_columns("tensor", {k: f() for k, f in build.items()})
    schema = schema_for("tensor")
    wanted = [f for f in schema if columns is None or f.name in columns]
    cols = {f.name: build[f.name]() for f in wanted}
    fields = [pa.field(f.name, cols[f.name].type) if f.name == "node" and node_dictionary else f
              for f in wanted]
    return pa.Table.from_pydict(cols, schema=pa.schema(fields))


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        text = read_regular(path)
    except OSError as e:
        raise ProbeError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not text.strip():
        raise ProbeError(f"{path}: the {what} is empty (0 bytes of JSON)")
    return text


def _load_json(path: Path, what: str, text: bytes | None = None) -> Any:
    if text is None:
        text = _read_bytes(path, what)
    try:
        # a key named twice in one object (an entry, a tensor's name) is refused, not read as
        # its last value: dump.json and construct.json; stack.json is only ever shown
        return loads(text) if what == "stack.json" else loads_unique(text)
    except DuplicateKey as e:
        raise ProbeError(f"{path}: {e} (a JSON reader would keep only the last); not a {what} "
                         "msprobe or probe wrote: re-run the dump or give another file") from None
    except json.JSONDecodeError as e:
        if _binary(text):
            raise ProbeError(f"{path}: a binary file, not JSON text; give the {what} msprobe "
                             "wrote") from None
        cut = e.pos >= len(text.rstrip()) - 1 or (e.msg.startswith("Unterminated string")
                                                   and b'"' not in text[e.pos + 1:])
        end = "truncated" if cut else "malformed"
        raise ProbeError(f"{path}: {end} JSON in the {what} at line {e.lineno} column {e.colno} "
                         f"({e.msg}); re-run the dump or give another file") from None
    except UnicodeDecodeError:
        raise ProbeError(f"{path}: a binary file, not JSON text (not UTF-8); give the {what} "
                         "msprobe wrote") from None
    except ValueError as e:                          # a number of thousands of digits
        raise ProbeError(f"{path}: a number out of range in the {what} ({str(e).split(':')[0]}); "
                         "not a file msprobe wrote") from None
    except RecursionError:
        raise ProbeError(f"{path}: the {what} nests too deeply to be read (more than about a "
                         "thousand levels); not a file msprobe wrote") from None


def _binary(text: bytes) -> bool:
    """Whether ``text`` looks like binary data rather than JSON text: its first 4 KB are not
    text in the encoding JSON's first bytes name (UTF-8, -16 or -32), or hold NUL characters."""
    head = text[:4096]
    encoding = json.detect_encoding(head)
    try:
        chars = head.decode(encoding)
    except UnicodeDecodeError as e:
        return e.start < len(head) - 4              # not a character cut at the sample's end
    return "\0" in chars


def _constant(value: Any, n: int, type: pa.DataType) -> pa.Array:
    """``n`` copies of ``value`` (built in Arrow, not from a Python list)."""
    import numpy as np

    return pa.array([value], type=type).take(np.zeros(n, dtype=np.int32))


def _numel(shape: pa.Array) -> tuple[pa.Array, tuple[int, str] | None]:
    """Product of each shape (``[]`` → 1, null → null), vectorised; and the first row whose
    shape is out of range with why (a negative dimension, more elements than int64 counts),
    or None.

    >>> _numel(pa.array([[2, 3], [], None, [4, -1]]))[0].to_pylist()
    [6, 1, None, -4]
    >>> _numel(pa.array([[2, 3], [4, -1]]))[1]
    (1, 'has a negative dimension')
    """
    import numpy as np

    if isinstance(shape, pa.ChunkedArray):
        shape = shape.combine_chunks()
    n = len(shape)
    offsets = shape.offsets.to_numpy(zero_copy_only=False)
    vals = shape.flatten().fill_null(1).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.diff(offsets)
    out = np.ones(n, dtype=np.int64)
    nonempty = lengths > 0
    bad = None
    if nonempty.any():
        starts = (offsets[:-1] - offsets[0])[nonempty]
        out[nonempty] = np.multiply.reduceat(vals, starts)
        bad = _bad_shape(vals, starts, np.flatnonzero(nonempty), int(lengths.max()))
    return pa.array(out, type=pa.int64(), mask=shape.is_null().to_numpy(zero_copy_only=False)), bad


def _bad_shape(vals: "np.ndarray", starts: "np.ndarray", rows: "np.ndarray",
               longest: int) -> tuple[int, str] | None:
    """The first of ``rows`` (shapes: ``vals`` from each of ``starts``) with a negative
    dimension or a product beyond int64, with why; None when all are in range. The product is
    recomputed in floats only when the largest dimension and the longest shape allow an
    overflow at all."""
    import numpy as np

    if vals.min() < 0:
        first = int(np.argmax(vals < 0))
        return int(rows[np.searchsorted(starts, first, side="right") - 1]), "has a negative dimension"
    if int(vals.max()).bit_length() * longest < 63:
        return None
    over = np.multiply.reduceat(vals.astype(np.float64), starts) >= 2.0 ** 63
    if over.any():
        return int(rows[np.argmax(over)]), "holds more elements than a 64-bit count"
    return None
