"""The per-tensor rows of a compare (``CompareResult.rows``): pairs, statistics metrics, verdicts.

One DuckDB query over the two normalised sides (``a_t``/``b_t``, :mod:`compare.normalise`) and
the matched groups (``pairs``, ``a_st``/``b_st``, :mod:`compare.match`) pairs the tensors of
every matched group by direction, slot and index, keeps the unmatched ones, and grades each
pair: differences and relative errors of max/min/mean/norm, the dtype- and scale-aware ``err``,
the tensor verdict (both as :mod:`compare.verdict` defines them) and its reason. The msprobe-style tensor names are put
in afterwards from the records, by position (:func:`tensor_names`, :func:`with_names`).

>>> import pyarrow as pa
>>> names, nodes = tensor_names(pa.table({"node": ["Module.fc.Linear.forward.0"] * 2,
...                                       "slot": ["input", "parameter"], "index": ["0", "weight"]}))
>>> names.to_pylist()
['Module.fc.Linear.forward.0.input.0', 'Module.fc.Linear.forward.0.parameters.weight']
"""

from __future__ import annotations

from typing import Any

from compare.verdict import CONTEXT_FLOOR, tensor_verdict_sql, tolerance_sql

__all__ = ["tensor_rows", "tensor_names", "with_names", "HELPER_COLUMNS", "PARTITION_ROWS"]

#: Columns of the rows query that later queries use but the result does not show.
HELPER_COLUMNS = ("grp_a", "grp_b", "ctx", "tol_pass", "tol_warn", "uninit")

#: Rows of both sides together from which the rows query, when DuckDB runs it on one thread,
#: runs as two halves on two threads instead.
PARTITION_ROWS = 16_384


def tensor_rows(con: Any, parts: int = 1, views: dict | None = None) -> Any:
    """The per-tensor rows (pyarrow.Table, in execution order, with the helper columns).
    ``views``: Arrow tables the query reads by name (the sides' tensor tables), registered on
    every cursor it runs on.

    With ``parts`` = 2 the query runs in halves (the call groups split by a hash of A's group, so
    each half holds whole groups) on two cursors at once. The rows are ordered here by
    (execution order, A's position, B's position): one numpy sort of three integer keys instead
    of a DuckDB ORDER BY that moves every column.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pyarrow as pa

    def run(k: int) -> Any:
        cur = con.cursor()
        for name, table in (views or {}).items():
            cur.register(name, table)
        try:
            return cur.sql(_rows_sql(k, parts)).to_arrow_table()
        finally:
            cur.close()

    if parts == 1:
        table = con.sql(_rows_sql(0, 1)).to_arrow_table()
    else:
        with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="compare-rows") as pool:
            table = pa.concat_tables(list(pool.map(run, range(parts))))
    order = np.lexsort([_int_key(table.column("pos_b")), _int_key(table.column("pos_a")),
                        _int_key(table.column("ord"))])
    table = table.take(pa.array(order))
    row_id = pa.array(np.arange(table.num_rows, dtype=np.int64))
    return table.add_column(0, "row_id", row_id)


#: msprobe's tensor name: the entry's name, then this per slot, then the index
_NAME_SEP = {"input": ".input.", "kwarg": ".input.", "output": ".output.",
             "parameter": ".parameters.", "parameter_grad": "."}


def tensor_names(tensors: Any) -> tuple[Any, Any]:
    """(msprobe tensor names, entry names) of one side's tensor records, by record position
    (``Module.fc.Linear.forward.0.input.0``, ``...parameters.weight``), built in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    node = tensors.column("node").combine_chunks()
    if pa.types.is_dictionary(node.type):
        node = node.dictionary.take(node.indices)
    slot = tensors.column("slot").combine_chunks()
    keys = pa.array(list(_NAME_SEP), type=pa.string())
    seps = pa.array(list(_NAME_SEP.values()), type=pa.string())
    sep = pc.fill_null(seps.take(pc.index_in(slot, value_set=keys)), ".")
    name = pc.binary_join_element_wise(node, sep, tensors.column("index").combine_chunks(), "")
    return name, node


def with_names(full: Any, names: tuple) -> Any:
    """The rows with both sides' tensor and entry names put in from the records by position
    (the query carries positions, not these long strings: a quarter of its time at 20k), and
    the reason of the pairs that agree. ``names``: :func:`tensor_names` of A, then of B."""
    import pyarrow.compute as pc

    (name_a, node_a), (name_b, node_b) = names
    pos_a, pos_b = full.column("pos_a"), full.column("pos_b")
    at = full.schema.get_field_index("name_slot_a")
    for i, (k, col) in enumerate((("name_a", name_a.take(pos_a)), ("name_b", name_b.take(pos_b)),
                                  ("node_a", node_a.take(pos_a)), ("node_b", node_b.take(pos_b)))):
        full = full.add_column(at + i, k, col)
    # the reason of a pair that agrees, the most common one, is put together here too
    i = full.schema.get_field_index("reason")
    reason = full.column(i)
    agrees = pc.and_(pc.is_null(reason), pc.equal(full.column("verdict"), "pass"))
    dtype = pc.fill_null(pc.coalesce(full.column("dtype_a"), full.column("dtype_b")), "?")
    text = pc.binary_join_element_wise("agrees within the ", dtype, " tolerance", "")
    full = full.set_column(i, "reason", pc.if_else(agrees, text, reason))
    return full.drop_columns(["name_slot_a", "name_slot_b", "pos_a", "pos_b"])


def _int_key(col: Any) -> Any:
    """An int64 column as a numpy sort key, nulls last."""
    import numpy as np
    import pyarrow.compute as pc

    big = np.iinfo(np.int64).max
    return pc.fill_null(col, big).to_numpy() if col.null_count else col.to_numpy()


def _rows_sql(k: int, parts: int) -> str:
    """The rows query of partition ``k`` of ``parts`` (unordered)."""
    pass_a, warn_a = tolerance_sql("r.dtype_a")
    pass_b, warn_b = tolerance_sql("r.dtype_b")

    def part(col: str) -> str:
        return "true" if parts == 1 else f"hash({col}) % {parts} = {k}"
    return f"""
    with pair_t as (
    with ta as (select t.*, p.grp_b as other, p.method, p.reason as mreason
                from a_t t join pairs p on p.grp_a = t.grp where {part("p.grp_a")}),
         tb as (select t.*, p.grp_a as other, p.method, p.reason as mreason
                from b_t t join pairs p on p.grp_b = t.grp where {part("p.grp_a")})
    select coalesce(ta.grp, tb.other) as grp_a, coalesce(ta.other, tb.grp) as grp_b,
      ta.pos is not null as name_slot_a, tb.pos is not null as name_slot_b,
      coalesce(ta.direction, tb.direction) as direction, coalesce(ta.slot, tb.slot) as slot,
      coalesce(ta.idx, tb.idx) as "index", coalesce(ta.method, tb.method) as match_method,
      coalesce(ta.mreason, tb.mreason) as match_reason,
      ta.dtype as dtype_a, tb.dtype as dtype_b, ta.shape as shape_a, tb.shape as shape_b,
      ta.numel as numel_a, tb.numel as numel_b,
      ta.mx as max_a, ta.mn as min_a, ta.mean as mean_a, ta.norm as norm_a,
      tb.mx as max_b, tb.mn as min_b, tb.mean as mean_b, tb.norm as norm_b,
      ta.nonfinite as nonfinite_a, tb.nonfinite as nonfinite_b, ta.hash as hash_a, tb.hash as hash_b,
      ta.tensor_file as file_a, tb.tensor_file as file_b, coalesce(ta.seq, tb.seq) as seq_any,
      coalesce(ta.uninit, false) or coalesce(tb.uninit, false) as uninit, ta.pos as pos_a, tb.pos as pos_b
    from ta full outer join tb
      on ta.grp = tb.other and ta.other = tb.grp and ta.direction = tb.direction
         and ta.slot = tb.slot and ta.idx = tb.idx
    union all
    select t.grp, null, true, false, t.direction, t.slot, t.idx, 'unmatched',
      'no counterpart in B', t.dtype, null, t.shape, null, t.numel, null, t.mx, t.mn, t.mean, t.norm,
      null, null, null, null, t.nonfinite, null, t.hash, null, t.tensor_file, null, t.seq, false, t.pos, null
    from a_t t join a_st st on st.grp = t.grp and st.state = 'unmatched' where {part("t.grp")}
    union all
    select null, t.grp, false, true, t.direction, t.slot, t.idx, 'unmatched',
      'no counterpart in A', null, t.dtype, null, t.shape, null, t.numel, null, null, null, null,
      t.mx, t.mn, t.mean, t.norm, null, t.nonfinite, null, t.hash, null, t.tensor_file, t.seq, false, null, t.pos
    from b_t t join b_st st on st.grp = t.grp and st.state = 'unmatched' where {part("t.grp")}
    ), c as (
      select *,
        greatest(abs(case when isfinite(max_a) then max_a end), abs(case when isfinite(min_a) then min_a end),
                 abs(case when isfinite(max_b) then max_b end), abs(case when isfinite(min_b) then min_b end)) as mag
      from pair_t
    ), ctx as (
      select grp_a, grp_b, direction, max(mag) as ctx from c group by all
    ), r as (
      select c.*, ctx.ctx,
        max_b - max_a as max_diff, min_b - min_a as min_diff, mean_b - mean_a as mean_diff,
        norm_b - norm_a as norm_diff,
        abs(max_b - max_a) / nullif(abs(max_a), 0) as max_rel,
        abs(min_b - min_a) / nullif(abs(min_a), 0) as min_rel,
        abs(mean_b - mean_a) / nullif(abs(mean_a), 0) as mean_rel,
        abs(norm_b - norm_a) / nullif(abs(norm_a), 0) as norm_rel,
        greatest(coalesce(c.mag, 0), {CONTEXT_FLOOR} * coalesce(ctx.ctx, 0), 1e-30) as sref,
        greatest(abs(coalesce(norm_a, 0)), abs(coalesce(norm_b, 0)), {CONTEXT_FLOOR} * coalesce(ctx.ctx, 0), 1e-30) as nref
      from c left join ctx on ctx.grp_a is not distinct from c.grp_a and ctx.grp_b is not distinct from c.grp_b
        and ctx.direction = c.direction
    ), e as (
      select r.*,
        case when not name_slot_a or not name_slot_b then null
             when uninit then 0.0
             when nonfinite_a or nonfinite_b then
               case when nonfinite_a and nonfinite_b and max_a is not distinct from max_b
                         and min_a is not distinct from min_b then 0.0 else 'inf'::double end
             else coalesce(greatest(abs(max_b - max_a) / sref, abs(min_b - min_a) / sref,
                                    abs(mean_b - mean_a) / sref, abs(norm_b - norm_a) / nref), 0.0) end as err,
        greatest({pass_a}, {pass_b}) as tol_pass, greatest({warn_a}, {warn_b}) as tol_warn
      from r
    )
    select grp_a, grp_b, name_slot_a, name_slot_b, direction, slot,
      "index", match_method, dtype_a, dtype_b, shape_a, shape_b,
      max_a, min_a, mean_a, norm_a, max_b, min_b, mean_b, norm_b,
      max_diff, min_diff, mean_diff, norm_diff, max_rel, min_rel, mean_rel, norm_rel, err,
      null::double as cosine, null::double as max_abs_err, null::double as max_rel_err,
      null::double as rmse, null::double as one_thousandth, null::double as one_ten_thousandth,
      nonfinite_a, nonfinite_b, uninit,
      case when hash_a is not null and hash_b is not null then hash_a = hash_b end as hash_match,
      file_a, file_b, ctx, tol_pass, tol_warn, seq_any as ord, pos_a, pos_b,
      {tensor_verdict_sql("name_slot_a", "name_slot_b")} as verdict,
      case when not name_slot_a or not name_slot_b then match_reason
           when uninit then 'uninitialised memory (an empty tensor): not compared'
           when nonfinite_a and not nonfinite_b then 'NaN/Inf only in A'
           when nonfinite_b and not nonfinite_a then 'NaN/Inf only in B'
           when numel_a is not null and numel_b is not null and numel_a <> numel_b then
                printf('shapes differ: %s vs %s', shape_a::varchar, shape_b::varchar)
           when hash_a is not null and hash_a = hash_b then 'identical (md5)'
           when nonfinite_a and nonfinite_b and err = 0 then 'NaN/Inf identical in both'
           when err <= tol_pass then null     -- 'agrees within the <dtype> tolerance': with_names
           else printf('%s differs: error %.2e > %.0e (%s)%s',
                case greatest(abs(coalesce(max_diff, 0)) / sref, abs(coalesce(min_diff, 0)) / sref,
                              abs(coalesce(mean_diff, 0)) / sref, abs(coalesce(norm_diff, 0)) / nref)
                     when abs(coalesce(max_diff, 0)) / sref then 'max' when abs(coalesce(min_diff, 0)) / sref then 'min'
                     when abs(coalesce(mean_diff, 0)) / sref then 'mean' else 'norm' end,
                err, case when err <= tol_warn then tol_pass else tol_warn end,
                coalesce(dtype_a, dtype_b, '?'),
                case when hash_a is not null and hash_b is not null then '; md5 differs' else '' end) end as reason
    from e
    """
