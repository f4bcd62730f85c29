"""Normalise the records of one side before anything is compared (DuckDB SQL, no row loops).

Per side ``X`` (``a`` or ``b``) two tables are built in a DuckDB connection:

- ``X_g``, one row per *call group* (a module's or API's forward call together with its
  backward and parameter-gradient entries): ``grp`` (an integer id: the position of the
  group's first entry in its dump), ``kind`` (module|api|comm), ``path``
  (module path, ``layers.0.attn``), ``cls`` / ``cls_norm`` (``Dense`` → ``linear``),
  ``canon`` (API name without framework: ``Primitive.matmul.MatMul`` / ``Torch.matmul`` →
  ``matmul``, ``Tensor.__add__`` → ``add``; in-place ``add_`` stays apart), ``call``,
  ``exact_key`` (the framework-free name used for exact matching: module path and call; API
  name and call number within the parent module), ``global_key`` (API call numbers counted
  over the whole dump, for a side without construct.json parents),
  ``fwd``/``bwd``/``pgrad`` (the entry names), ``ord_f``/``ord_b`` (execution order), ``parent``
  (the parent group), ``depth``, ``leaf`` (last path component);
- ``X_t``, one row per tensor: the group, ``direction``, ``slot``, ``idx`` (parameter names
  normalised: ``gamma``→``weight``, ``beta``→``bias``), ``pos`` (the record's position: its
  msprobe-style name is built from the records, see :func:`compare.tensor_rows.tensor_names`),
  ``dtype`` (``Float32`` / ``torch.float32`` / ``mindspore.float32`` → ``float32``), stats,
  ``nonfinite``.

>>> import duckdb
>>> con = duckdb.connect()
>>> con.sql("select " + DTYPE_SQL.format(col="'mindspore.Float32'")).fetchall()
[('float32',)]
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["normalise_side", "DTYPE_SQL", "CLASS_SYNONYMS", "API_SYNONYMS", "PARAM_SYNONYMS",
           "UNINITIALISED"]

#: Framework-specific class names → one name (lower case, no framework decoration).
CLASS_SYNONYMS: dict[str, str] = {
    "dense": "linear", "sequentialcell": "sequential", "celllist": "modulelist",
    "celldict": "moduledict", "batchnorm2d": "batchnorm2d", "conv2d": "conv2d",
    "layernorm": "layernorm", "embedding": "embedding", "dropout": "dropout",
}
#: API names that differ across frameworks for one operation.
API_SYNONYMS: dict[str, str] = {
    "dense": "linear", "batchmatmul": "bmm", "realdiv": "div", "truediv": "div",
    "biasadd": "bias_add", "reducemean": "mean", "reducesum": "sum", "reducemax": "max",
    "expanddims": "unsqueeze", "concat": "cat", "transpose": "permute", "swapaxes": "transpose",
    "fastgelu": "gelu", "sigmoidcrossentropywithlogits": "binary_cross_entropy_with_logits",
}
#: APIs whose outputs are uninitialised memory: not compared (any values are right).
UNINITIALISED = ("empty", "empty_like", "new_empty", "empty_strided")
#: Parameter names that differ across frameworks.
PARAM_SYNONYMS: dict[str, str] = {
    "gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
    "moving_variance": "running_var", "embedding_table": "weight",
}

DTYPE_SQL = ("lower(regexp_replace(regexp_replace(coalesce({col}, ''), "
             "'^(torch|mindspore|numpy|np|ms|tf|paddle)\\.', ''), '^(mindspore\\.)', ''))")


def _case_map(col: str, table: dict[str, str]) -> str:
    if not table:
        return col
    whens = " ".join(f"when '{k}' then '{v}'" for k, v in table.items())
    return f"(case {col} {whens} else {col} end)"


def normalise_side(con: Any, side: str, tensors: pa.Table, nodes: pa.Table) -> None:
    """Create ``{side}_g`` and ``{side}_t`` in ``con``'s database from one side's records.

    The tables are database tables, not temporary ones, so the two sides can be normalised at
    once on two cursors of one in-memory database and read from any of its connections.
    """
    import numpy as np

    pos = pa.array(np.arange(tensors.num_rows, dtype=np.int64))
    con.register(f"{side}_raw_t", tensors.append_column("pos", pos))
    con.register(f"{side}_raw_n", nodes)
    cls_norm = _case_map("lower(cls)", CLASS_SYNONYMS)
    canon = _case_map("canon0", API_SYNONYMS)
    con.execute(f"""
    create or replace table {side}_e as
    with e as (
        select node, min(seq) as seq from {side}_raw_t group by node
    ), p as (
        select node, seq, string_split(node, '.') as s from e
    ), q as (
        select node, seq, s, len(s) as n,
          case when s[1] in ('Module', 'Cell') and len(s) >= 4 and regexp_full_match(s[-1], '[0-9]+') then 'module'
               when len(s) >= 4 and regexp_full_match(s[-2], '[0-9]+') then
                    case when s[1] = 'Distributed' then 'comm' else 'api' end
               when len(s) >= 4 and regexp_full_match(s[-1], '[0-9]+') then 'module'
               else 'api' end as kind
        from p
    ), r as (
      select node, seq, kind, s[1] as prefix,
        array_to_string(s[2:-3], '.') as body,
        case when kind = 'module' then s[-2] else s[-1] end as dir_raw,
        try_cast(case when kind = 'module' then s[-1] else s[-2] end as bigint) as call
      from q
    )
    -- a call group's id: the position of its first entry (an integer key joins faster than
    -- the "prefix.body#call" text that defines the group)
    select *, min(seq) over (partition by prefix || '.' || body || '#' || coalesce(call, 0)) as grp
    from r
    """)
    con.execute(f"""
    create or replace table {side}_g0 as
    with x as (
      select grp, any_value(kind) as kind,
        any_value(prefix) as prefix, any_value(body) as body, any_value(call) as call,
        max(case when dir_raw = 'forward' then node end) as fwd,
        max(case when dir_raw = 'backward' then node end) as bwd,
        max(case when dir_raw = 'parameters_grad' then node end) as pgrad,
        min(case when dir_raw = 'forward' then seq end) as seq_f,
        min(case when dir_raw <> 'forward' then seq end) as seq_b,
        min(seq) as seq0
      from {side}_e group by grp
    ), y as (
      select *,
        case when kind = 'module' then
             case when contains(body, '.') then regexp_extract(body, '^(.*)\\.[^.]*$', 1) else '' end
             else body end as path,
        case when kind = 'module' then regexp_extract(body, '([^.]*)$', 1) else prefix || '.' || body end as cls,
        lower(regexp_replace(case when prefix = 'Primitive' then split_part(body, '.', 1)
                                  else regexp_extract(body, '([^.]*)$', 1) end, '^__(.*)__$', '\\1')) as canon0
      from x
    )
    select grp, kind, prefix, path, cls, {cls_norm} as cls_norm, {canon} as canon, call,
      fwd, bwd, pgrad, seq_f, seq_b, seq0
    from y
    """)
    con.execute(f"""
    create or replace table {side}_g as
    select g.*,
      case when g.kind = 'module' then 'm:' || g.path || ':' || coalesce(g.call, 0)
           else g.kind || ':' || coalesce(pg.path || ':' || coalesce(pg.call, 0), '') || ':' || g.canon || ':' ||
                (row_number() over (partition by g.kind, pg.grp, g.canon order by g.seq0) - 1) end as exact_key,
      case when g.kind = 'module' then 'm:' || g.path || ':' || coalesce(g.call, 0)
           else g.kind || '::' || g.canon || ':' ||
                (row_number() over (partition by g.kind, g.canon order by g.seq0) - 1) end as global_key,
      row_number() over (order by g.seq_f nulls last, g.seq0) - 1 as ord_f,
      case when g.seq_b is null then null else row_number() over (order by g.seq_b nulls last) - 1 end as ord_b,
      pg.grp as parent, n.parent as parent_node,
      coalesce(n.depth, 0) as depth,
      case when g.kind = 'module' then regexp_extract(g.path, '([^.]*)$', 1) else g.canon end as leaf
    from {side}_g0 g
    left join {side}_raw_n n on n.node = g.fwd
    left join {side}_g0 pg on pg.fwd = n.parent
    """)
    param = _case_map('"index"', PARAM_SYNONYMS)
    uninit = ", ".join(f"'{u}'" for u in UNINITIALISED)
    dtype = DTYPE_SQL.format(col="raw")
    con.execute(f"""
    create or replace table {side}_t as
    with dt as (select raw, {dtype} as norm from (select distinct dtype as raw from {side}_raw_t)),
         eg as (select e.node, g.grp, g.kind, g.canon from {side}_e e join {side}_g g on g.grp = e.grp)
    select g.grp, t.node, t.seq, t.pos, t.direction, t.slot,
      case when t.slot in ('parameter', 'parameter_grad') then {param} else t."index" end as idx,
      dt.norm as dtype, t.shape, t.numel, t."max" as mx, t."min" as mn, t.mean as mean,
      t.l2norm as norm, t.hash, t.tensor_file,
      (isnan(coalesce(t."max", 0)) or isinf(coalesce(t."max", 0)) or isnan(coalesce(t."min", 0))
        or isinf(coalesce(t."min", 0)) or isnan(coalesce(t.mean, 0)) or isinf(coalesce(t.mean, 0))
        or isnan(coalesce(t.l2norm, 0)) or isinf(coalesce(t.l2norm, 0))
        or coalesce(t.nan_count, 0) > 0 or coalesce(t.inf_count, 0) > 0) as nonfinite,
      (g.kind <> 'module' and g.canon in ({uninit}) and t.slot = 'output'
       and t.direction = 'forward') as uninit
    from {side}_raw_t t
    join eg g on g.node = t.node
    left join dt on dt.raw is not distinct from t.dtype
    where t.value is null
    """)
