"""The dump's row building: each value seen at a call boundary becomes its msprobe JSON entry and
one tensor record row.

The columns are the tensor record's, named once in :mod:`probe.collectors.records`. A row holds the
columns a call sets (:data:`ROW_COLUMNS`, in the schema's order); the step's columns
(:data:`STEP_COLUMNS`) are set when its table is made, and the statistics
(:data:`STAT_COLUMNS`) arrive as columns of their own when the step's statistics are gathered
(:func:`apply_statistics`), which also fills the JSON entries.

For the statistics task the common values (a plain tensor, an exact int, float or bool) are
made by the native half, ``probe.dumper._rows_native`` (an optional C extension built at install):
the same entry, row, leaf, handle, identity and tensor id as :meth:`RowBuilder.value_py`, and one
statistics record per leaf that :func:`records_statistics` turns into the step's columns on the
writer thread; what it does not take comes back to the Python path (``PROBE_NATIVE=0`` forces
the Python path for everything).

The ``tensor`` task names each tensor's file with :func:`tensor_file_name`: distinct dump names
get distinct file names, and one name gets the same file name in every run and rank.

With ``tensor_ids`` each tensor also gets the data's id in the step (the ``tensor_id`` column and
the entry's ``"tensor_id"``): 0, 1, 2, ... in the order the step first reads each distinct
:meth:`~probe.engine_adapter.base.StatsBackend.identity`, the same id while that key holds (its
:meth:`~probe.engine_adapter.base.StatsBackend.owner`, for torch the storage, is alive: the key its
statistics are reused under), so a module's output and the input of the module that takes it
share one id, as do a tensor and its dense views (reshape, transpose); an in-place change (a
new version) or memory given to other data gets a new id. A tensor without an identity (no
storage; every MindSpore tensor for now) has none (null): an id of its own would claim that no
other row holds its data, which nobody knows.

>>> ROW_COLUMNS[:3], STAT_COLUMNS[0]
(('seq', 'node', 'node_kind'), 'max')
"""

from __future__ import annotations

import dataclasses

import hashlib
import json
import logging
import math
import re
import time
import weakref
from typing import Any, Callable, NamedTuple, Sequence

from probe.collectors import msprobe_writer
from probe.collectors.records import TENSOR
from probe.engine_adapter.base import FLOAT, INTEGER, OPAQUE, StatsBackend
from probe.ground.native import native_enabled

log = logging.getLogger(__name__)

#: columns the writer sets for a whole step
STEP_COLUMNS = ("run", "rank", "step", "host_ts_ns")
#: the statistics, gathered at the end of a step
STAT_COLUMNS = ("max", "min", "mean", "l2norm", "nan_count", "inf_count")
#: the columns of a row, in the schema's order (the row lists below are written in this order)
ROW_COLUMNS = tuple(n for n in TENSOR.names if n not in STEP_COLUMNS and n not in STAT_COLUMNS)

#: index texts of the first positions (no str(i) per argument)
POS = tuple(str(i) for i in range(64))
#: exact scalar types and their msprobe ``type`` (subclasses take the isinstance path)
_SCALAR_TYPES = {int: "int", float: "float", bool: "bool", str: "str"}

#: the longest tensor file name (without its extension) :func:`tensor_file_name` gives
MAX_FILE_STEM = 160
#: the longest slot suffix (``.input.0``, ``.kwargs.<key>``) kept whole in a cut name
_MAX_TAIL = 48
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
#: what marks a name as hashed: a dash and 16 hex digits before a dot or the end
_HASH_MARK = re.compile(r"-[0-9a-f]{16}(?:\.|$)")


#: each slot's category in msprobe's tensor file names (``<entry>.<category>.<index>``); a
#: parameter gradient's name has none (``Module.fc.Linear.parameters_grad.0.weight``)
SLOT_CATEGORIES = {"input": "input", "kwarg": "kwargs", "output": "output",
                   "parameter": "parameters", "parameter_grad": None}


def tensor_file_name(node: str, slot: str, index: str) -> str:
    """The file name (no extension) of the tensor ``index`` of ``slot`` of dump entry ``node``.

    msprobe's name: ``<node>.<category>.<index>``, the category of the slot
    (:data:`SLOT_CATEGORIES`: ``input``, ``kwargs``, ``output``, ``parameters``; none for a
    parameter gradient, ``<node>.<index>``), when that is short and made of file-name-safe
    characters only (``[A-Za-z0-9_.-]``, no ``..``, no leading dot). Otherwise the cleaned name
    is cut to fit and a 16-hex-digit hash of the full name follows the node part, before the
    slot suffix, which is always kept. Collision-free: two kept names differ as their dump names
    do; a hashed name holds the hash mark (``-`` and 16 hex digits) that no kept name holds (a
    dump name that looks like one is hashed too); two hashed names differ unless 64-bit BLAKE2b
    hashes of different names collide. The same name gives the same file name in every run,
    process and rank, so two dumps of one model pair up. The full name stays in dump.json,
    whose ``data_name`` points at the file.

    >>> tensor_file_name("Module.fc.Linear.forward.0", "input", "0")
    'Module.fc.Linear.forward.0.input.0'
    >>> tensor_file_name("Module.fc.Linear.forward.0", "parameter", "weight")
    'Module.fc.Linear.forward.0.parameters.weight'
    >>> tensor_file_name("Module.fc.Linear.parameters_grad.0", "parameter_grad", "weight")
    'Module.fc.Linear.parameters_grad.0.weight'
    >>> tensor_file_name("Functional.linear.0.forward", "kwarg", "bias")
    'Functional.linear.0.forward.kwargs.bias'
    >>> tensor_file_name("Module.a_b.Linear.forward.0", "output", "0")
    'Module.a_b.Linear.forward.0.output.0'
    >>> tensor_file_name("Module.a/b.Linear.forward.0", "output", "0")
    'Module.a_b.Linear.forward.0-d1338fc8fd0b71eb.output.0'
    >>> len(tensor_file_name("Module." + "x" * 300 + ".Linear.forward.0", "input", "0"))
    160
    """
    category = SLOT_CATEGORIES.get(slot, slot)
    suffix = f".{index}" if category is None else f".{category}.{index}"
    full = node + suffix
    if (len(full) <= MAX_FILE_STEM and not _UNSAFE.search(full) and ".." not in full
            and not full.startswith(".") and not _HASH_MARK.search(full)):
        return full
    digest = hashlib.blake2b(full.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    tail = _clean(suffix)[:_MAX_TAIL]
    head = _clean(node).lstrip(".")[:MAX_FILE_STEM - len(tail) - 17] or "_"
    return f"{head}-{digest}{tail}"


def _clean(text: str) -> str:
    """``text`` with every character outside ``[A-Za-z0-9_.-]`` made ``_`` and no ``..`` left."""
    text = _UNSAFE.sub("_", text)
    while ".." in text:
        text = text.replace("..", "._")
    return text


_new_leaf = tuple.__new__      # a Leaf without NamedTuple's keyword-handling constructor


class Leaf(NamedTuple):
    """A tensor whose statistics come at the end of the step."""

    entry: dict          # the JSON dict of this tensor
    handle_index: int    # index into the step's handles, -1 when none
    row: int             # index into the step's rows
    numel: int
    kind: str
    filled: bool = False  # the entry's statistics are in already (a host tensor's, read at once)


class RowBuilder:
    """Turns the values of one step into JSON entries and rows; :meth:`start_step` begins a step.

    ``save(t, name)`` writes a tensor file named from ``name`` (a :func:`tensor_file_name`) and
    returns its name (the ``tensor`` task), or is None. ``tensor_ids``: record each tensor's id
    in the step (see the module docstring; off: the ``tensor_id`` column is null and entries
    have no ``"tensor_id"``, for a builder that sees single calls rather than a whole step).
    """

    def __init__(self, stats: StatsBackend, *, want_hash: bool,
                 save: Callable[[Any, str], str] | None, tensor_ids: bool = False) -> None:
        self.stats = stats
        self._tensor_type = stats.tensor_type
        self._want_hash = want_hash
        self._save = save
        self._tensor_ids = tensor_ids
        self._native = None if want_hash or save is not None else _native_rows(self)
        #: ``value(x, seq, node, kind, direction, slot, index)``: the JSON entry of ``x`` (a
        #: tensor, a scalar or a container of them), its rows recorded. The native half's for
        #: plain tensors and exact scalars (the statistics task's hot path), which hands
        #: everything else back to :meth:`value_py`; else :meth:`value_py` itself.
        self.value = self.value_py if self._native is None else self._native.value
        self.start_step()

    def start_step(self) -> None:
        """New lists for a new step (the last step's are the writer's now); ids start at 0."""
        self.rows: list[list] = []
        self.leaves: list[Leaf] = []
        self.handles: list[Any] = []
        #: identity -> (the key's owner, weakly; its handle index; digest; tensor id)
        self._seen: dict[Any, tuple] = {}
        self._ids = [0]             # the next tensor id (a list: the native half shares it)
        self._flat = bytearray()    # the native half's statistics records (see records_statistics)
        if self._native is not None:
            self._native.reset(self.rows, self.leaves, self.handles, self._seen, self._ids, self._flat)

    def accept_prepared(self, kind: type) -> bool:
        """Take instances of ``kind`` (a tuple subclass: ``(dtype, shape, numel,
        requires_grad, statistics, group)``, an adapter's gradients already read) as values:
        the entry and row their tensor would give, values of one group sharing a handle and a
        tensor id; with two more items, ``(key, owner)``, the value is found in (and put into)
        the step's identity table with the tensors instead of its group. Only the native half
        takes them: False without it."""
        if self._native is None:
            return False
        self._native.set_prepared(kind)
        return True

    def statistics_records(self) -> bytearray | None:
        """The step's statistics as the native half recorded them (:func:`records_statistics`
        reads them), when it read every leaf's; None otherwise (use :func:`apply_statistics`)."""
        if self._native is None or self._native.covered() != len(self.leaves):
            return None
        return self._flat

    def seen_table(self) -> dict:
        """The step's identity table (for the writer to let go of: freeing a mix-level step's
        thousand keys and weak references costs the training thread ~0.3 ms)."""
        return self._seen

    def value_py(self, x: Any, seq: int, node: str, kind: str, direction: str, slot: str, index: str) -> Any:
        """``value`` in Python (the native half hands back what it does not take)."""
        if isinstance(x, self._tensor_type):
            return self._tensor(x, seq, node, kind, direction, slot, index)
        if x is None:
            return None
        tx = type(x)
        if tx in _SCALAR_TYPES:
            return self._scalar(_SCALAR_TYPES[tx], x, seq, node, kind, direction, slot, index)
        if isinstance(x, bool):
            return self._scalar("bool", x, seq, node, kind, direction, slot, index)
        if isinstance(x, int):
            return self._scalar("int", x, seq, node, kind, direction, slot, index)
        if isinstance(x, float):
            return self._scalar("float", x, seq, node, kind, direction, slot, index)
        if isinstance(x, str):
            return self._scalar("str", x, seq, node, kind, direction, slot, index)
        if (tx is list or tx is tuple):
            return [self.value(v, seq, node, kind, direction, slot, f"{index}.{i}") for i, v in enumerate(x)]
        type_name = self.stats.scalar_type(x)
        if type_name is not None:
            v = list(x) if type_name.endswith("Size") else str(x)
            return self._scalar(type_name, v, seq, node, kind, direction, slot, index)
        if isinstance(x, slice):
            return self._scalar("slice", [_plain(x.start), _plain(x.stop), _plain(x.step)],
                                seq, node, kind, direction, slot, index)
        if x is Ellipsis:
            return self._scalar("ellipsis", "...", seq, node, kind, direction, slot, index)
        if isinstance(x, dict):
            return {str(k): self.value(v, seq, node, kind, direction, slot, f"{index}.{k}") for k, v in x.items()}
        if isinstance(x, (list, tuple)):  # namedtuples and list subclasses
            return [self.value(v, seq, node, kind, direction, slot, f"{index}.{i}") for i, v in enumerate(x)]
        fields = getattr(tx, "__dataclass_fields__", None)
        if fields is not None and not isinstance(x, type):     # a dataclass instance: its fields
            return {name: self.value(getattr(x, name, None), seq, node, kind, direction, slot,
                                     f"{index}.{name}")
                    for name, f in fields.items() if f._field_type is dataclasses._FIELD}
        return None

    def _scalar(self, type_name: str, v: Any, seq: int, node: str, kind: str, direction: str,
                slot: str, index: str) -> dict:
        tv = type(v)
        if tv is int:
            text = int.__repr__(v)
        elif tv is bool:
            text = "true" if v else "false"
        elif tv is float and math.isfinite(v):
            text = float.__repr__(v)
        else:
            finite = not isinstance(v, float) or math.isfinite(v)
            text = json.dumps(v if finite else str(v))
            if not finite:
                v = msprobe_writer.json_float(v)
            elif tv is list:          # a slice's bounds may be floats
                v = [msprobe_writer.json_float(x) if type(x) is float else x for x in v]
        self.rows.append([seq, node, kind, direction, slot, index, type_name, None, None,
                          None, None, None, text, None])
        return {"type": type_name, "value": v}

    def _tensor(self, t: Any, seq: int, node: str, kind: str, direction: str, slot: str,
                index: str) -> dict:
        # the hot path of the dump (every tensor of every hooked call): one backend call for
        # what the tensor is and where its bytes are, the reduction only for bytes not yet read
        stats = self.stats
        type_name, dtype, shape, numel, requires_grad, stat_kind, key = stats.inspect(t)
        shape = list(shape)
        data, note = stats.readable(t)
        read_numel = numel
        if data is not t:           # freed memory (not read), or a shard of the tensor
            if data is None:
                stat_kind, key = OPAQUE, None
            else:
                _, _, _, read_numel, _, local_kind, key = stats.inspect(data)
                stat_kind = local_kind if stat_kind != OPAQUE else OPAQUE
            _warn_once(note, node)
            t = data
        handles = self.handles
        handle_index = -1
        digest = file_name = tensor_id = None
        seen = self._seen.get(key) if key is not None else None
        if seen is not None and _owner_holds(seen[0](), key):
            _, handle_index, digest, tensor_id = seen
        else:
            if stat_kind != OPAQUE:
                handle_index = len(handles)
                handles.append(stats.reduce(t, stat_kind))
            if self._want_hash and t is not None:
                digest = stats.digest(t)
            if key is not None:
                if self._tensor_ids:
                    tensor_id = self._ids[0]
                    self._ids[0] = tensor_id + 1
                self._seen[key] = (weakref.ref(stats.owner(t)), handle_index, digest, tensor_id)
        # a host tensor's statistics are read already: into its entry now, which is cheaper
        # here than on the writer thread (whose Python holds the GIL the training thread needs)
        h = handles[handle_index] if handle_index >= 0 else None
        if type(h) is list:
            filled = True
            mx, mn, mean, norm = _entry_statistics(h, read_numel, stat_kind)
        else:
            mx = mn = mean = norm = None
            filled = False
        entry: dict[str, Any] = {"type": type_name, "dtype": dtype, "shape": shape,
                                 "Max": mx, "Min": mn, "Mean": mean, "Norm": norm}
        if requires_grad is not None:
            entry["requires_grad"] = requires_grad
        if digest is not None:
            entry["md5"] = digest
        if self._save is not None and t is not None:
            file_name = self._save(t, tensor_file_name(node, slot, index))
            entry["data_name"] = file_name
        if tensor_id is not None:
            entry["tensor_id"] = tensor_id
        if note is not None:
            entry["note"] = note
        rows = self.rows
        self.leaves.append(_new_leaf(Leaf, (entry, handle_index, len(rows), read_numel, stat_kind, filled)))
        rows.append([seq, node, kind, direction, slot, index, dtype, shape, numel,
                     digest, file_name, requires_grad, None, tensor_id])
        return entry


def _owner_holds(owner: Any, key: tuple) -> bool:
    """Whether ``owner`` (a key's :meth:`~probe.engine_adapter.base.StatsBackend.owner`, None
    when gone) still holds the address ``key`` starts with: a storage freed or resized since (as
    FSDP and ZeRO-3 do with sharded parameters) may have left it to other data, which a new
    tensor with an equal key then holds. An owner that is not a storage is taken as holding it.

    >>> import torch
    >>> t = torch.ones(4)
    >>> s = t.untyped_storage()
    >>> _owner_holds(s, (t.data_ptr(),)), _owner_holds(None, (t.data_ptr(),))
    (True, False)
    >>> _ = s.resize_(0)
    >>> _owner_holds(s, (t.data_ptr() or 64,))
    False
    """
    if owner is None:
        return False
    nbytes = getattr(owner, "nbytes", None)   # a storage's method (a tensor's is a number)
    if not callable(nbytes) or not isinstance(key[0], int):
        return True
    base = owner.data_ptr()
    return base != 0 and base <= key[0] <= base + nbytes()


#: the kinds of tensors not read (or read in part) already warned about (once a process each)
_WARNED: set[str] = set()


def _warn_once(note: str | None, node: str) -> None:
    """Log, once per kind (the note's text up to its first colon), that a tensor of ``node``
    was not read whole; the entry's ``"note"`` says so each time."""
    if note is None:
        return
    kind = note.split(":", 1)[0]
    if kind not in _WARNED:
        _WARNED.add(kind)
        log.warning("dump: %s (first at %s); such entries carry a \"note\" and null or "
                    "per-shard statistics", note, node)


def _native_rows(builder: RowBuilder) -> Any:
    """The native half of ``builder`` (``probe.dumper._rows_native``, built at install), or None:
    not built, ``PROBE_NATIVE=0``, or a backend without a :meth:`native_spec`."""
    if not native_enabled():
        return None
    spec_of = getattr(builder.stats, "native_spec", None)
    if spec_of is None:
        return None
    try:
        from probe.dumper import _rows_native
    except ImportError:
        return None
    spec = spec_of()
    if spec is None:
        return None
    return _rows_native.Rows(
        spec["tensor_types"], spec["dtypes"], spec["strided"], builder.stats.reduce,
        builder.value_py, builder._tensor, Leaf, msprobe_writer.json_float, (FLOAT, INTEGER, OPAQUE),
        spec["type_name"], spec["f32"], spec["f64"], builder._tensor_ids)


def _entry_statistics(v: Sequence[float], numel: int, kind: str) -> tuple:
    """An entry's ``Max, Min, Mean, Norm`` from a tensor's gathered statistics ``v``."""
    if kind == FLOAT:
        mx, mn, s, q = v[0], v[1], v[2], v[3]
        mean = s / numel
        norm = math.sqrt(q) if q >= 0 else q
        if not math.isfinite(mx - mn + mean + norm):   # msprobe's NaN/Infinity literals
            json_float = msprobe_writer.json_float
            return json_float(mx), json_float(mn), json_float(mean), json_float(norm)
        return mx, mn, mean, norm
    return int(v[0]), int(v[1]), None, None


def apply_statistics(leaves: Sequence[Leaf], values: Sequence[Any], n_rows: int) -> dict[str, Any]:
    """Put the gathered statistics of a step into its JSON entries (those not filled yet);
    returns the statistics columns of its ``n_rows`` rows as Arrow arrays (null where a row has
    none: a scalar, an opaque tensor; an integer tensor has no mean or norm and counts 0).

    Built with NumPy from the step's handles and leaves at once (a step at mix level has
    ~1,200 rows, and this runs on the writer thread, whose Python holds the GIL the training
    thread needs)."""
    import itertools

    import numpy as np

    if not leaves:
        return records_statistics(b"", n_rows)
    entries, handle_indexes, rows, numels, kinds, filled = zip(*leaves)
    if not all(filled):             # a device tensor's entry waits for the gather
        for e, h, numel, kind, done in zip(entries, handle_indexes, numels, kinds, filled):
            if not done and h >= 0 and values[h] is not None:
                e["Max"], e["Min"], e["Mean"], e["Norm"] = _entry_statistics(values[h], numel, kind)
    n = len(leaves)
    # one row of six per handle: [max, min, sum, sumsq, nan, inf]; an integer handle's two
    # values are padded (its mean and norm are null below, its counts 0)
    if values and all(v is not None and len(v) == 6 for v in values):
        table = np.fromiter(itertools.chain.from_iterable(values), np.float64, 6 * len(values))
    else:
        pad = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        table = np.fromiter(itertools.chain.from_iterable(
            pad if v is None else (v if len(v) == 6 else (v[0], v[1], 0.0, 0.0, 0.0, 0.0)) for v in values),
            np.float64, 6 * len(values))
    table = table.reshape(len(values), 6)
    hi = np.fromiter(handle_indexes, np.int64, n)
    got = hi >= 0                   # a leaf with statistics: a handle, and a value for it
    if any(v is None for v in values):
        gathered = np.fromiter((v is not None for v in values), bool, len(values))
        got &= gathered[np.maximum(hi, 0)] if len(values) else False
    hi = hi[got]
    r = np.fromiter(rows, np.int64, n)[got]
    is_float = np.fromiter(map(FLOAT.__eq__, kinds), bool, n)[got]
    is_int = np.fromiter(map(INTEGER.__eq__, kinds), bool, n)[got]
    keep = is_float | is_int
    hi, r, is_float, is_int = hi[keep], r[keep], is_float[keep], is_int[keep]
    a = table[hi]
    numel = np.fromiter(numels, np.float64, n)[got][keep]
    # the native builder's records (row, is_float, max, min, mean, norm, nan, inf), one per
    # leaf with statistics: the columns are made from them in one place
    records = np.empty((len(r), 8), dtype=np.float64)
    records[:, 0] = r
    records[:, 1] = is_float
    records[:, 2] = np.where(is_int, np.trunc(a[:, 0]), a[:, 0])
    records[:, 3] = np.where(is_int, np.trunc(a[:, 1]), a[:, 1])
    q = a[:, 3]
    with np.errstate(invalid="ignore", divide="ignore"):
        records[:, 4] = np.where(is_float, a[:, 2] / numel, np.nan)
        records[:, 5] = np.where(is_float, np.where(q >= 0, np.sqrt(np.maximum(q, 0)), q), np.nan)
    records[:, 6] = np.where(is_float, a[:, 4], 0)
    records[:, 7] = np.where(is_float, a[:, 5], 0)
    return records_statistics(records.tobytes(), n_rows)


def records_statistics(flat: bytes | bytearray, n_rows: int) -> dict[str, Any]:
    """The statistics columns of a step's ``n_rows`` rows (as :func:`apply_statistics` returns
    them) from the native row builder's records: 8 float64 per leaf with statistics (row,
    is_float, max, min, mean, norm, nan_count, inf_count), every entry filled already.

    >>> import struct
    >>> cols = records_statistics(struct.pack("8d", 1, 1, 4.0, -3.0, 1.0, 5.0, 0, 0), 2)
    >>> cols["max"].to_pylist(), cols["nan_count"].to_pylist()
    ([None, 4.0], [None, 0])
    """
    import numpy as np
    import pyarrow as pa

    types = _stat_types()
    a = np.frombuffer(flat, dtype=np.float64).reshape(-1, 8)
    r = a[:, 0].astype(np.int64)
    is_float = a[:, 1] > 0
    has = np.zeros(n_rows, dtype=bool)
    has[r] = True
    has_float = np.zeros(n_rows, dtype=bool)
    has_float[r[is_float]] = True
    columns = {}
    for k, (name, valid) in enumerate((("max", has), ("min", has), ("mean", has_float), ("l2norm", has_float))):
        full = np.zeros(n_rows, dtype=np.float64)
        full[r] = a[:, 2 + k]
        columns[name] = pa.array(full, type=types[name], mask=~valid)
    for k, name in ((6, "nan_count"), (7, "inf_count")):
        full = np.zeros(n_rows, dtype=np.int64)
        full[r] = a[:, k]
        columns[name] = pa.array(full, type=types[name], mask=~has)
    return columns


_STAT_TYPES: dict[str, Any] = {}


def _stat_types() -> dict[str, Any]:
    if not _STAT_TYPES:
        _STAT_TYPES.update({field.name: field.type for field in TENSOR if field.name in STAT_COLUMNS})
    return _STAT_TYPES


class TensorTables:
    """Turns a step's rows and statistics into a tensor-record table (on the writer thread).

    A training step records the same calls every step: the columns that describe them (names,
    slots, dtypes, shapes, ...) are the same lists, and their Arrow arrays are kept from the last
    step and used again when they are; only the other columns are converted each step.
    """

    #: the describing columns: the same every step while the model makes the same calls
    STRUCTURE = ("seq", "node", "node_kind", "direction", "slot", "index", "dtype", "shape", "numel",
                 "requires_grad")

    def __init__(self, run: str, rank: int) -> None:
        import pyarrow as pa

        self.pa = pa
        self.types = {field.name: field.type for field in TENSOR}
        self.run, self.rank = run, rank
        self.key: list | None = None
        self.arrays: dict[str, Any] = {}

    def table(self, step: int, time_ns: int, rows: list[list], statistics: dict[str, list]) -> Any:
        """The table of one step: ``rows`` as :class:`RowBuilder` made them, ``statistics`` as
        :func:`apply_statistics` returned them."""
        pa, types = self.pa, self.types
        n = len(rows)
        columns = dict(zip(ROW_COLUMNS, zip(*rows) if n else [()] * len(ROW_COLUMNS)))
        key = [columns[name] for name in self.STRUCTURE]
        if key != self.key:
            self.key = key
            self.arrays = {name: pa.array(columns[name], type=types[name]) for name in self.STRUCTURE}
            self.arrays["run"] = pa.array([self.run] * n, type=types["run"])
            self.arrays["rank"] = pa.array([self.rank] * n, type=types["rank"])
        arrays = dict(self.arrays)
        for name, col in (*columns.items(), *statistics.items()):
            if name not in arrays:
                arrays[name] = col if isinstance(col, pa.Array) else pa.array(col, type=types[name])
        arrays["step"] = pa.array([step] * n, type=types["step"])
        arrays["host_ts_ns"] = pa.array([time_ns] * n, type=types["host_ts_ns"])
        return pa.Table.from_arrays([arrays[name] for name in TENSOR.names], schema=TENSOR)


def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, (int, float, str, bool)) else str(v)
