"""The four record kinds, defined once as Arrow schemas and used by every writer and reader.

- ``tensor``: one tensor (or scalar) seen at a module/API boundary, with its statistics and,
  when the dump knew it, ``tensor_id``: an id per step and rank shared by every row that saw
  the same unchanged data (a module's output and the next one's input), null where unknown
  (msprobe's own dumps, older dumps, scalars, a tensor without storage);
- ``node``: one node of the module/API tree (msprobe's construct.json);
- ``event``: a profiler event (mark, range, comm, step, kernel);
- ``metric``: one metric point (time, job, rank, step, name, value).

>>> import pyarrow as pa
>>> t = table_from_rows("metric", [{"time_ns": 1, "job": "j", "rank": 0, "step": 0,
...                                  "name": "loss", "value": 2.5}])
>>> t.num_rows, t.schema.field("value").type
(1, DataType(double))
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pyarrow as pa

TENSOR = pa.schema([
    ("run", pa.string()),
    ("rank", pa.int32()),
    ("step", pa.int64()),
    ("seq", pa.int64()),            # call order within the step
    ("node", pa.string()),          # full dump name, e.g. Module.layers.0.attn.q_proj.Linear.forward.0
    ("node_kind", pa.string()),     # module | api | comm
    ("direction", pa.string()),     # forward | backward
    ("slot", pa.string()),          # input | kwarg | output | parameter | parameter_grad
    ("index", pa.string()),         # index path inside the slot: "0", "0.1", "attention_mask", "weight"
    ("dtype", pa.string()),
    ("shape", pa.list_(pa.int64())),
    ("numel", pa.int64()),
    ("max", pa.float64()),
    ("min", pa.float64()),
    ("mean", pa.float64()),
    ("l2norm", pa.float64()),
    ("nan_count", pa.int64()),
    ("inf_count", pa.int64()),
    ("hash", pa.string()),
    ("tensor_file", pa.string()),
    ("host_ts_ns", pa.int64()),
    ("requires_grad", pa.bool_()),
    ("value", pa.string()),         # JSON text of a non-tensor argument (int, float, str, None)
    ("tensor_id", pa.int64()),      # the dump's per-step id of the data (equal: the same tensor); null: unknown
])

NODE = pa.schema([
    ("run", pa.string()),
    ("rank", pa.int32()),
    ("node", pa.string()),
    ("parent", pa.string()),
    ("class_name", pa.string()),
    ("depth", pa.int32()),
    ("order", pa.int64()),
    ("stack_ref", pa.string()),
])

EVENT = pa.schema([
    ("run", pa.string()),
    ("rank", pa.int32()),
    ("step", pa.int64()),
    ("domain", pa.string()),
    ("name", pa.string()),
    ("kind", pa.string()),          # mark | range | comm | step | kernel
    ("host_start_ns", pa.int64()),
    ("host_end_ns", pa.int64()),
    ("device_start_ns", pa.int64()),
    ("device_end_ns", pa.int64()),
    ("thread", pa.int64()),
    ("payload", pa.string()),       # JSON text
])

METRIC = pa.schema([
    ("time_ns", pa.int64()),
    ("job", pa.string()),
    ("rank", pa.int32()),
    ("step", pa.int64()),
    ("name", pa.string()),
    ("value", pa.float64()),
])

SCHEMAS: dict[str, pa.Schema] = {"tensor": TENSOR, "node": NODE, "event": EVENT, "metric": METRIC}

#: DuckDB view name for each record kind.
VIEWS: dict[str, str] = {"tensor": "tensors", "node": "nodes", "event": "events", "metric": "metrics"}


def schema_for(kind: str) -> pa.Schema:
    """The Arrow schema of a record kind (``tensor``, ``node``, ``event`` or ``metric``)."""
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise ValueError(f"unknown record kind {kind!r}; valid: {', '.join(SCHEMAS)}") from None


def table_from_rows(kind: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Build a table of ``kind`` from dict rows; missing fields become null."""
    schema = schema_for(kind)
    rows = list(rows)
    columns = {name: [r.get(name) for r in rows] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)


def table_from_columns(kind: str, columns: Mapping[str, list]) -> pa.Table:
    """Build a table of ``kind`` from column lists (the cheap path for hot writers)."""
    schema = schema_for(kind)
    n = max((len(v) for v in columns.values()), default=0)
    data = {name: columns.get(name, [None] * n) for name in schema.names}
    return pa.Table.from_pydict(data, schema=schema)


def conform(kind: str, table: pa.Table | pa.RecordBatch) -> pa.Table:
    """Cast/complete ``table`` to the schema of ``kind`` (extra columns are an error)."""
    schema = schema_for(kind)
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if table.schema.equals(schema, check_metadata=False):
        return table
    extra = set(table.column_names) - set(schema.names)
    if extra:
        raise ValueError(f"columns {sorted(extra)} are not in the {kind} schema")
    cols = []
    for field in schema:
        if field.name in table.column_names:
            cols.append(table.column(field.name).cast(field.type))
        else:
            cols.append(pa.nulls(table.num_rows, type=field.type))
    return pa.Table.from_arrays(cols, schema=schema)
