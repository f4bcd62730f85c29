"""Normalise the records of one side before anything is compared (DuckDB SQL over the entries
and groups, Arrow and numpy over the tensors; no row loops).

:func:`normalise_side` takes one side's records and returns a :class:`Side`, two
pyarrow.Tables (the later stages register them where they query them; by convention as
``a_g``/``b_g`` and ``a_t``/``b_t``):

- ``groups``, one row per *call group* (a module's or API's forward call together with its
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
- ``tensors``, one row per tensor: the group, ``direction``, ``slot``, ``idx`` (parameter names
  normalised: ``gamma``→``weight``, ``beta``→``bias``), ``pos`` (the record's position: its
  msprobe-style name is built from the records, see :func:`probe.compare.tensor_rows.tensor_names`),
  ``dtype`` (``Float32`` / ``torch.float32`` / ``mindspore.float32`` → ``float32``), stats,
  ``nonfinite``, ``uninit``, ``rid`` (its row number).

>>> import duckdb
>>> con = duckdb.connect()
>>> con.sql("select " + DTYPE_SQL.format(col="'mindspore.Float32'")).fetchall()
[('float32',)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from probe.ground.frameworks import module_prefixes

__all__ = ["Side", "normalise_side", "DTYPE_SQL", "CLASS_SYNONYMS", "API_SYNONYMS", "PARAM_SYNONYMS",
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

@dataclass
class Side:
    """One side of a compare, normalised (:func:`normalise_side`): ``groups``, one row per call
    group, and ``tensors``, one row per tensor record (their columns: the module docstring)."""

    groups: pa.Table
    tensors: pa.Table


DTYPE_SQL = ("lower(regexp_replace(regexp_replace(coalesce({col}, ''), "
             "'^(torch|mindspore|numpy|np|ms|tf|paddle)\\.', ''), '^(mindspore\\.)', ''))")


def _case_map(col: str, table: dict[str, str]) -> str:
    if not table:
        return col
    whens = " ".join(f"when '{k}' then '{v}'" for k, v in table.items())
    return f"(case {col} {whens} else {col} end)"


def normalise_side(con: Any, tensors: pa.Table, nodes: pa.Table) -> Side:
    """One side's records (``tensors``: :data:`probe.compare.load.COLUMNS`; ``nodes``: the node
    records) normalised into a :class:`Side`: its call groups and its tensor table (see the
    module docstring), two pyarrow.Tables.

    The groups are built by DuckDB in temporary tables of ``con`` (a connection or cursor of
    the caller's: the two sides are normalised at once on two cursors of one in-memory
    database), dropped before it returns. The tensor table is built in Arrow from the records'
    own buffers: its statistics, shapes, hashes and files are the records' columns, not copies,
    and its entry and group are integer lookups (no join on the entries' names).
    """
    import numpy as np
    import pyarrow.compute as pc

    n = tensors.num_rows
    node = _column(tensors, "node")
    if not pa.types.is_dictionary(node.type):                    # entry id per tensor, in
        node = pc.dictionary_encode(node, null_encoding="encode")  # order of first appearance
    eid = node.indices
    con.register("side_raw_e", pa.table({
        "eid": pa.array(np.arange(len(node.dictionary), dtype=np.int32)), "node": node.dictionary,
        "seq": _min_by(eid.to_numpy(zero_copy_only=False), _column(tensors, "seq"), len(node.dictionary))}))
    con.register("side_raw_n", nodes)
    cls_norm = _case_map("lower(cls)", CLASS_SYNONYMS)
    canon = _case_map("canon0", API_SYNONYMS)
    modules = ", ".join(f"'{p}'" for p in module_prefixes())     # identifiers: nothing to quote
    con.execute(f"""
    create or replace temp table side_e0 as
    with p as (
        select eid, node, seq, string_split(node, '.') as s from side_raw_e
    ), q as (
        select eid, node, seq, s, len(s) as n,
          case when s[1] in ({modules}) and len(s) >= 4 and regexp_full_match(s[-1], '[0-9]+') then 'module'
               when len(s) >= 4 and regexp_full_match(s[-2], '[0-9]+') then
                    case when s[1] = 'Distributed' then 'comm' else 'api' end
               when len(s) >= 4 and regexp_full_match(s[-1], '[0-9]+') then 'module'
               else 'api' end as kind
        from p
    ), r as (
      select eid, node, seq, kind, s[1] as prefix,
        array_to_string(s[2:-3], '.') as body,
        case when kind = 'module' then s[-2] else s[-1] end as dir_raw,
        try_cast(case when kind = 'module' then s[-1] else s[-2] end as bigint) as call
      from q
    )
    select *, prefix || '.' || body || '#' || coalesce(call, 0) as gkey from r
    """)
    # a call group's id: the position of its first entry (an integer key joins faster than
    # the "prefix.body#call" text that defines the group); the window over the keys alone,
    # joined back (a window sorts every column it is given)
    con.execute(f"""
    create or replace temp table side_e as
    with w as (select eid, min(seq) over (partition by gkey) as grp from side_e0)
    select e.eid, e.node, e.seq, e.kind, e.prefix, e.body, e.dir_raw, e.call, w.grp
    from side_e0 e join w on w.eid = e.eid
    """)
    con.execute(f"""
    create or replace temp table side_g0 as
    with x as (
      select grp, any_value(kind) as kind,
        any_value(prefix) as prefix, any_value(body) as body, any_value(call) as call,
        max(case when dir_raw = 'forward' then node end) as fwd,
        max(case when dir_raw = 'backward' then node end) as bwd,
        max(case when dir_raw = 'parameters_grad' then node end) as pgrad,
        min(case when dir_raw = 'forward' then seq end) as seq_f,
        min(case when dir_raw <> 'forward' then seq end) as seq_b,
        min(seq) as seq0
      from side_e group by grp
    ), l as (
      select *, split_part(body, '.', -1) as last from x
    ), m as (
      select *, case when prefix = 'Primitive' then split_part(body, '.', 1) else last end as api from l
    ), y as (
      -- string functions, not regular expressions (the same text in half the time): path is
      -- the body before its last dot, the class its last part, canon0 the API's name without
      -- dunder marks; a text with a newline, which RE2's '.' does not take, keeps the
      -- expressions' answer
      select *,
        case when kind = 'module' then
             case when not contains(body, '.') then ''
                  when contains(body, chr(10)) then regexp_extract(body, '^(.*)\\.[^.]*$', 1)
                  else body[:length(body) - length(last) - 1] end
             else body end as path,
        case when kind = 'module' then last else prefix || '.' || body end as cls,
        lower(case when length(api) >= 4 and starts_with(api, '__') and ends_with(api, '__')
                        and not contains(api, chr(10)) then api[3:-3] else api end) as canon0
      from m
    )
    select grp, kind, prefix, path, cls, {cls_norm} as cls_norm, {canon} as canon, call,
      fwd, bwd, pgrad, seq_f, seq_b, seq0
    from y
    """)
    # the joins first, then the numbering (in numpy, over the keys alone) joined back by row
    con.execute(f"""
    create or replace temp table side_g1 as
    select g.*, pg.grp as parent, n.parent as parent_node, coalesce(n.depth, 0) as depth,
      pg.path as parent_path, pg.call as parent_call
    from side_g0 g
    left join side_raw_n n on n.node = g.fwd
    left join side_g0 pg on pg.fwd = n.parent
    """)
    con.register("side_g_order", _numbering(
        con.sql("select rowid as rid, kind, parent, canon, seq0, seq_f, seq_b from side_g1").to_arrow_table()))
    con.execute(f"""
    create or replace temp table side_g as
    select g.grp, g.kind, g.prefix, g.path, g.cls, g.cls_norm, g.canon, g.call, g.fwd, g.bwd, g.pgrad,
      g.seq_f, g.seq_b, g.seq0,
      case when g.kind = 'module' then 'm:' || g.path || ':' || coalesce(g.call, 0)
           else g.kind || ':' || coalesce(g.parent_path || ':' || coalesce(g.parent_call, 0), '') || ':' || g.canon || ':' ||
                w.k_local end as exact_key,
      case when g.kind = 'module' then 'm:' || g.path || ':' || coalesce(g.call, 0)
           else g.kind || '::' || g.canon || ':' || w.k_global end as global_key,
      w.ord_f, w.ord_b, g.parent, g.parent_node, g.depth,
      case when g.kind = 'module' then regexp_extract(g.path, '([^.]*)$', 1) else g.canon end as leaf
    from side_g1 g join side_g_order w on w.rid = g.rowid
    """)
    con.unregister("side_g_order")
    uninit = ", ".join(f"'{u}'" for u in UNINITIALISED)
    call_groups = con.sql("select * from side_g").to_arrow_table()
    # each entry's group, and whether its outputs are uninitialised memory, by entry id
    flags = con.sql(f"""
    select grp, coalesce(kind <> 'module' and canon in ({uninit}), false) as uninit from side_g
    """).to_arrow_table()
    entry_grp = con.sql("select grp from side_e order by eid").to_arrow_table().column(0).combine_chunks()
    for name in ("side_raw_e", "side_raw_n"):
        con.unregister(name)
    for name in ("e0", "e", "g0", "g1", "g"):
        con.execute(f"drop table side_{name}")
    # each record's group (its entry's, when the entry's group is one), and whether its
    # entry's outputs are uninitialised memory
    at = pc.index_in(entry_grp, value_set=flags.column("grp").combine_chunks())
    grp = flags.column("grp").combine_chunks().take(at).take(eid)
    entry_uninit = flags.column("uninit").combine_chunks().take(at).take(eid)
    slot, direction = _column(tensors, "slot"), _column(tensors, "direction")
    is_out_fwd = pc.and_kleene(pc.equal(slot, "output"), pc.equal(direction, "forward"))
    table = pa.table({
        "grp": grp, "seq": tensors.column("seq"), "pos": pa.array(np.arange(n, dtype=np.int64)),
        "direction": direction, "slot": slot, "idx": _param_names(slot, _column(tensors, "index")),
        "dtype": _dtypes(con, _column(tensors, "dtype")), "shape": tensors.column("shape"),
        "numel": tensors.column("numel"), "mx": tensors.column("max"), "mn": tensors.column("min"),
        "mean": tensors.column("mean"), "norm": tensors.column("l2norm"), "hash": tensors.column("hash"),
        "tensor_file": tensors.column("tensor_file"), "nonfinite": _nonfinite(tensors),
        "uninit": pc.fill_null(pc.and_kleene(entry_uninit, is_out_fwd), False),
    })
    # the records of a tensor: a named entry that has a group, and no non-tensor value
    keep = pc.and_(pc.and_(pc.is_valid(node), pc.is_valid(grp)), pc.is_null(tensors.column("value")))
    if pc.sum(keep).as_py() != n:
        table = table.filter(keep)
    return Side(groups=call_groups,
                tensors=table.append_column("rid", pa.array(np.arange(table.num_rows, dtype=np.int64))))


def _numbering(g: pa.Table) -> pa.Table:
    """The call groups' numbers, by ``rid``: ``k_local`` (their place among the groups of the
    same kind, parent and API, by first entry), ``k_global`` (among those of the same kind and
    API), ``ord_f`` (forward execution order: the first forward entry, else the first entry;
    groups without a forward entry last) and ``ord_b`` (backward order; null without one). As
    SQL's ``row_number() over (partition by ... order by ...) - 1``, nulls last, in numpy:
    windows in DuckDB sort every column they are given.

    >>> t = _numbering(pa.table({"rid": [0, 1, 2], "kind": ["api"] * 3, "parent": [None, 7, None],
    ...     "canon": ["add"] * 3, "seq0": [5, 3, 1], "seq_f": [5, None, 1], "seq_b": [None, 9, 8]}))
    >>> [t.column(k).to_pylist() for k in ("k_local", "k_global", "ord_f", "ord_b")]
    [[1, 0, 0], [2, 1, 0], [1, 2, 0], [None, 1, 0]]
    """
    import numpy as np
    import pyarrow.compute as pc

    n = g.num_rows

    def codes(col: str) -> Any:
        return pc.dictionary_encode(g.column(col).combine_chunks(), null_encoding="encode").indices.to_numpy(
            zero_copy_only=False)

    def last(col: str) -> tuple[Any, Any]:       # (is null, value): sorts nulls last
        c = g.column(col).combine_chunks()
        return c.is_null().to_numpy(zero_copy_only=False), pc.fill_null(c, 0).to_numpy(zero_copy_only=False)

    def rank(keys: list, parts: list) -> Any:
        """Each row's place within its partition (``parts``, keys that must all be equal),
        ordered by ``keys`` (last key first, as numpy's lexsort)."""
        order = np.lexsort(keys + parts)
        out = np.zeros(n, dtype=np.int64)
        if n:
            start = np.ones(n, dtype=bool)
            start[1:] = np.zeros(n - 1, dtype=bool)
            for p in parts:
                ps = p[order]
                start[1:] |= ps[1:] != ps[:-1]
            first = np.maximum.accumulate(np.where(start, np.arange(n), 0))
            out[order] = np.arange(n) - first
        return out
    kind, canon = codes("kind"), codes("canon")
    parent_null, parent = last("parent")
    seq0_null, seq0 = last("seq0")
    f_null, seq_f = last("seq_f")
    b_null, seq_b = last("seq_b")
    by_first = [seq0, seq0_null]
    ord_b = rank([seq_b, b_null], [])
    return pa.table({
        "rid": g.column("rid"),
        "k_local": rank(by_first, [canon, parent, parent_null, kind]),
        "k_global": rank(by_first, [canon, kind]),
        "ord_f": rank([seq0, seq0_null, seq_f, f_null], []),
        "ord_b": pa.array(ord_b, mask=b_null),
    })


def _min_by(keys: Any, values: pa.Array, k: int) -> pa.Array:
    """The least non-null ``values`` for each key ``0..k-1`` (null where a key has none)."""
    import numpy as np

    valid = values.is_valid().to_numpy(zero_copy_only=False)
    v = values.to_numpy(zero_copy_only=False) if values.null_count == 0 else \
        values.fill_null(0).to_numpy(zero_copy_only=False)
    out = np.zeros(k, dtype=np.int64)
    has = np.zeros(k, dtype=bool)
    if k:
        out[:] = np.iinfo(np.int64).max
        np.minimum.at(out, keys[valid], v[valid])
        has[keys[valid]] = True
    return pa.array(out, mask=~has)


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _param_names(slot: pa.Array, index: pa.Array) -> pa.Array:
    """``index`` with parameter names made framework-free (:data:`PARAM_SYNONYMS`) where the
    slot is a parameter or its gradient."""
    import pyarrow.compute as pc

    keys = pa.array(list(PARAM_SYNONYMS), type=pa.string())
    values = pa.array(list(PARAM_SYNONYMS.values()), type=pa.string())
    renamed = pc.coalesce(values.take(pc.index_in(index, value_set=keys)), index)
    return pc.if_else(pc.is_in(slot, value_set=pa.array(["parameter", "parameter_grad"])), renamed, index)


def _dtypes(con: Any, dtype: pa.Array) -> pa.Array:
    """The normalised dtype of every record (:data:`DTYPE_SQL` run once per distinct dtype;
    a missing dtype is ``''``)."""
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(dtype, null_encoding="encode")
    import numpy as np

    con.register("raw_dtypes", pa.table({"k": pa.array(np.arange(len(enc.dictionary))), "raw": enc.dictionary}))
    try:
        names = con.sql(f"select {DTYPE_SQL.format(col='raw')} from raw_dtypes order by k").to_arrow_table()
    finally:
        con.unregister("raw_dtypes")
    return names.column(0).combine_chunks().take(enc.indices)


def _nonfinite(tensors: pa.Table) -> pa.Array:
    """Whether a record holds NaN/±Inf: a non-finite statistic, or a NaN/Inf count above 0."""
    import numpy as np
    import pyarrow.compute as pc

    out = np.zeros(tensors.num_rows, dtype=bool)
    for k in ("max", "min", "mean", "l2norm"):
        out |= ~np.isfinite(pc.fill_null(tensors.column(k), 0.0).to_numpy())
    for k in ("nan_count", "inf_count"):
        col = tensors.column(k)
        if col.null_count < len(col):
            out |= pc.fill_null(col, 0).to_numpy() > 0
    return pa.array(out)
