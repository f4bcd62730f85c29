"""The per-tensor rows of a compare (``CompareResult.rows``): pairs, statistics metrics, verdicts.

:func:`tensor_rows` takes the two normalised sides (:class:`probe.compare.normalise.Side`) and
the matched groups (:class:`probe.compare.match.Matches`), pyarrow.Tables it registers on the
connection it is given (``a_t``/``b_t``, ``pairs``, ``a_st``/``b_st``), and returns the rows, a
pyarrow.Table, in three steps:

1. **pairing** (DuckDB, on the keys alone): the tensors of every matched group are paired by
   direction, slot and index, and the unmatched ones kept: each row is a row number in A, one
   in B (either may be missing) and the pair of groups it belongs to;
2. **gathering** (Arrow): the rows are put in execution order (by execution order, A's
   position, B's position: one numpy sort of three integer keys) and each side's columns are
   taken from its table by row number (a join would copy them all through its hash table);
3. **grading** (DuckDB, one projection, in halves on two threads when large): differences and
   relative errors of max/min/mean/norm, the dtype- and scale-aware ``err``, the tensor verdict
   (both as :mod:`probe.compare.verdict` defines them) and its reason.

The msprobe-style tensor names are put in afterwards from the records, by position
(:func:`tensor_names`, :func:`with_names`).

>>> import pyarrow as pa
>>> names, nodes = tensor_names(pa.table({"node": ["Module.fc.Linear.forward.0"] * 2,
...                                       "slot": ["input", "parameter"], "index": ["0", "weight"]}))
>>> names.to_pylist()
['Module.fc.Linear.forward.0.input.0', 'Module.fc.Linear.forward.0.parameters.weight']
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from probe.compare.match import Matches
from probe.compare.normalise import Side
from probe.compare.tables import registered
from probe.compare.verdict import CONTEXT_FLOOR, NOISE_ULPS, eps_sql, tensor_verdict_sql, tolerance_sql

__all__ = ["tensor_rows", "tensor_names", "with_names", "HELPER_COLUMNS", "PARTITION_ROWS"]

#: Columns of the rows query that later queries use but the result does not show.
HELPER_COLUMNS = ("grp_a", "grp_b", "ctx", "tol_pass", "tol_warn", "uninit", "settled")

#: Rows of both sides together from which the rows query, when DuckDB runs it on one thread,
#: runs as two halves on two threads instead.
PARTITION_ROWS = 16_384


def tensor_rows(con: Any, a: Side, b: Side, matches: Matches, parts: int = 1) -> pa.Table:
    """The per-tensor rows (pyarrow.Table, in execution order, with the :data:`HELPER_COLUMNS`
    and the records' positions, ``pos_a``/``pos_b``, that :func:`with_names` replaces by names)
    of sides ``a`` and ``b`` matched as ``matches`` (see the module docstring), queried on
    ``con``; with ``parts`` = 2 the grading runs in two halves of the rows on two cursors at once.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pyarrow.compute as pc

    ta, tb = a.tensors, b.tensors
    pairs = matches.pairs.append_column("pid", pa.array(np.arange(matches.pairs.num_rows, dtype=np.int64)))
    with registered(con, a_t=ta, b_t=tb, pairs=pairs, a_st=matches.state_a, b_st=matches.state_b):
        pairing = con.sql(_PAIRING_SQL).to_arrow_table()
    rid_a, rid_b = pairing.column("rid_a").combine_chunks(), pairing.column("rid_b").combine_chunks()
    order = np.lexsort([_int_key(tb.column("pos").take(rid_b)), _int_key(ta.column("pos").take(rid_a)),
                        _int_key(pc.coalesce(ta.column("seq").take(rid_a), tb.column("seq").take(rid_b)))])
    rows = _gather(pairing.take(pa.array(order)), ta, tb, matches.pairs)
    with registered(con, pair_t=rows):
        ctx = con.sql(f"select grp_a, grp_b, direction, max({_MAG_SQL}) as ctx, max({_NORM_SQL}) as ctx_norm "
                      "from pair_t group by all").to_arrow_table()
    n = rows.num_rows

    def grade(k: int) -> Any:
        cur = con.cursor()
        try:
            lo, hi = n * k // parts, n * (k + 1) // parts
            with registered(cur, pair_t=rows.slice(lo, hi - lo), row_ctx=ctx):
                return cur.sql(_GRADE_SQL).to_arrow_table()
        finally:
            cur.close()

    if parts == 1:
        graded = grade(0)
    else:
        with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="compare-rows") as pool:
            graded = pa.concat_tables(list(pool.map(grade, range(parts))))
    row_id = graded.column("row_id").to_numpy()
    if n > 1 and not bool(np.all(row_id[1:] > row_id[:-1])):    # a parallel plan reordered them
        graded = graded.take(pa.array(np.argsort(row_id, kind="stable")))
    return _assemble(rows, graded)


#: The columns of :func:`tensor_rows`, in order, and where each comes from: ``g`` the gathered
#: rows, ``c`` the grading, ``None`` a tensor-mode metric (null until
#: :func:`probe.compare.metrics.add_tensor_metrics`); a rename as ``(name, source column)``.
COLUMNS = (
    ("row_id", "g"), ("grp_a", "g"), ("grp_b", "g"), ("name_slot_a", "g"), ("name_slot_b", "g"),
    ("direction", "g"), ("slot", "g"), ("index", "g"), ("match_method", "g"), ("dtype_a", "g"),
    ("dtype_b", "g"), ("shape_a", "g"), ("shape_b", "g"), ("max_a", "g"), ("min_a", "g"),
    ("mean_a", "g"), ("norm_a", "g"), ("max_b", "g"), ("min_b", "g"), ("mean_b", "g"), ("norm_b", "g"),
    ("max_diff", "c"), ("min_diff", "c"), ("mean_diff", "c"), ("norm_diff", "c"), ("max_rel", "c"),
    ("min_rel", "c"), ("mean_rel", "c"), ("norm_rel", "c"), ("err", "c"), ("cosine", None),
    ("max_abs_err", None), ("max_rel_err", None), ("rmse", None), ("one_thousandth", None),
    ("one_ten_thousandth", None), ("nonfinite_a", "g"), ("nonfinite_b", "g"), ("uninit", "g"),
    ("hash_match", "c"), ("file_a", "g"), ("file_b", "g"), ("ctx", "c"), ("tol_pass", "c"),
    ("tol_warn", "c"), ("settled", "c"), (("ord", "seq_any"), "g"), ("pos_a", "g"), ("pos_b", "g"), ("verdict", "c"),
    ("reason", "c"),
)
def _assemble(rows: Any, graded: Any) -> Any:
    """The result's columns (:data:`COLUMNS`) from the gathered rows and the graded ones."""
    shape = pa.list_(pa.field("l", pa.int64()))   # as DuckDB, which used to build them, names them
    names, cols = [], []
    for name, src in COLUMNS:
        name, col = name if isinstance(name, tuple) else (name, name)
        if src is None:
            value = pa.nulls(rows.num_rows, pa.float64())
        else:
            value = (rows if src == "g" else graded).column(col)
            if name in ("shape_a", "shape_b"):
                value = value.cast(shape)
        names.append(name)
        cols.append(value)
    return pa.table(cols, names=names)


def _gather(pairing: Any, ta: Any, tb: Any, pid_info: Any) -> Any:
    """The grading's input, one row per pairing row (in its order): each side's columns taken
    by row number, the match method and reason from the pair (or the side without one)."""
    import numpy as np
    import pyarrow.compute as pc

    rid_a, rid_b = pairing.column("rid_a").combine_chunks(), pairing.column("rid_b").combine_chunks()
    part = pairing.column("part").combine_chunks()
    pid = pairing.column("pid").combine_chunks()

    # B's columns are taken on a second thread while A's are here (Arrow's take lets go of the GIL)
    from concurrent.futures import ThreadPoolExecutor

    cols = ("seq", "direction", "slot", "idx", "dtype", "shape", "numel", "mx", "mn", "mean", "norm",
            "nonfinite", "hash", "tensor_file", "pos")
    with ThreadPoolExecutor(1, thread_name_prefix="compare-gather") as pool:
        taking_b = pool.submit(lambda: {c: tb.column(c).take(rid_b) for c in cols})
        got_a = {c: ta.column(c).take(rid_a) for c in cols}
        got_b = taking_b.result()

    def a(col: str) -> Any:
        return got_a[col]

    def b(col: str) -> Any:
        return got_b[col]
    matched = pc.equal(part, 0)
    method = pc.if_else(matched, pid_info.column("method").take(pid), "unmatched")
    reason = pc.if_else(matched, pid_info.column("reason").take(pid),
                        pc.if_else(pc.equal(part, 1), "no counterpart in B", "no counterpart in A"))
    seq_a, seq_b = a("seq"), b("seq")
    return pa.table({
        "row_id": pa.array(np.arange(pairing.num_rows, dtype=np.int64)),
        "grp_a": pairing.column("grp_a"), "grp_b": pairing.column("grp_b"),
        "name_slot_a": rid_a.is_valid(), "name_slot_b": rid_b.is_valid(),
        "direction": pc.coalesce(a("direction"), b("direction")), "slot": pc.coalesce(a("slot"), b("slot")),
        "index": pc.coalesce(a("idx"), b("idx")), "match_method": method, "match_reason": reason,
        "dtype_a": a("dtype"), "dtype_b": b("dtype"), "shape_a": a("shape"), "shape_b": b("shape"),
        "numel_a": a("numel"), "numel_b": b("numel"),
        "max_a": a("mx"), "min_a": a("mn"), "mean_a": a("mean"), "norm_a": a("norm"),
        "max_b": b("mx"), "min_b": b("mn"), "mean_b": b("mean"), "norm_b": b("norm"),
        "nonfinite_a": a("nonfinite"), "nonfinite_b": b("nonfinite"), "hash_a": a("hash"), "hash_b": b("hash"),
        "file_a": a("tensor_file"), "file_b": b("tensor_file"), "seq_any": pc.coalesce(seq_a, seq_b),
        "uninit": pairing.column("uninit"), "pos_a": a("pos"), "pos_b": b("pos"),
    })


#: msprobe's tensor name: the entry's name, then this per slot, then the index
_NAME_SEP = {"input": ".input.", "kwarg": ".input.", "output": ".output.",
             "parameter": ".parameters.", "parameter_grad": "."}


def tensor_names(tensors: Any) -> tuple[Any, Any]:
    """(msprobe tensor names, entry names) of one side's tensor records, by record position
    (``Module.fc.Linear.forward.0.input.0``, ``...parameters.weight``), built in Arrow."""
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

    from concurrent.futures import ThreadPoolExecutor

    (name_a, node_a), (name_b, node_b) = names
    pos_a, pos_b = full.column("pos_a"), full.column("pos_b")
    at = full.schema.get_field_index("name_slot_a")
    with ThreadPoolExecutor(1, thread_name_prefix="compare-names") as pool:   # B's on a second thread
        taking_b = pool.submit(lambda: (name_b.take(pos_b), node_b.take(pos_b)))
        taken_a = (name_a.take(pos_a), node_a.take(pos_a))
        taken_b = taking_b.result()
    for i, (k, col) in enumerate((("name_a", taken_a[0]), ("name_b", taken_b[0]),
                                  ("node_a", taken_a[1]), ("node_b", taken_b[1]))):
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


#: Step 1: the pairs of row numbers (``rid`` in each side's table), matched tensors first,
#: then the tensors of unmatched groups (``part`` 0, 1 for A's, 2 for B's); ``pid``: the row of
#: ``pairs`` a matched tensor's groups come from.
_PAIRING_SQL = """
    with p as (select pid, grp_a, grp_b from pairs),
    ta as (select t.rid, t.grp, t.direction, t.slot, t.idx, t.uninit, p.grp_b as other, p.pid
           from a_t t join p on p.grp_a = t.grp),
    tb as (select t.rid, t.grp, t.direction, t.slot, t.idx, t.uninit, p.grp_a as other, p.pid
           from b_t t join p on p.grp_b = t.grp)
    select coalesce(ta.grp, tb.other) as grp_a, coalesce(ta.other, tb.grp) as grp_b,
      coalesce(ta.pid, tb.pid) as pid, 0::tinyint as part, ta.rid as rid_a, tb.rid as rid_b,
      coalesce(ta.uninit, false) or coalesce(tb.uninit, false) as uninit
    from ta full outer join tb
      on ta.grp = tb.other and ta.other = tb.grp and ta.direction = tb.direction
         and ta.slot = tb.slot and ta.idx = tb.idx
    union all
    select t.grp, null, null, 1, t.rid, null, false
    from a_t t join a_st st on st.grp = t.grp and st.state = 'unmatched'
    union all
    select null, t.grp, null, 2, null, t.rid, false
    from b_t t join b_st st on st.grp = t.grp and st.state = 'unmatched'
"""

#: A tensor pair's magnitude: the largest finite |max| or |min| of either side.
_MAG_SQL = """greatest(abs(case when isfinite(max_a) then max_a end), abs(case when isfinite(min_a) then min_a end),
                 abs(case when isfinite(max_b) then max_b end), abs(case when isfinite(min_b) then min_b end))"""

#: A tensor pair's L2 norm: the larger finite norm of either side.
_NORM_SQL = """greatest(abs(case when isfinite(norm_a) then norm_a end), abs(case when isfinite(norm_b) then norm_b end))"""
#: Whether one side of a pair holds a tensor of which nothing was read: no statistic, hash or
#: file (uninitialised memory, freed memory, a dtype without statistics).
_BARE_SQL = ("(name_slot_{s} and max_{s} is null and min_{s} is null and mean_{s} is null and norm_{s} is null "
             "and hash_{s} is null and file_{s} is null)")


def _grade_sql() -> str:
    """Step 3 over ``pair_t`` (the gathered rows) and ``row_ctx`` (the largest magnitude per
    group pair and direction), keeping the rows' order: the columns it computes (the others
    are the gathered ones, put beside them in Arrow, :data:`COLUMNS`)."""
    pass_a, warn_a = tolerance_sql("r.dtype_a")
    pass_b, warn_b = tolerance_sql("r.dtype_b")
    bare_a, bare_b = _BARE_SQL.format(s="a"), _BARE_SQL.format(s="b")
    return f"""
    with c0 as (
      select *, {_MAG_SQL} as mag,
        name_slot_a and name_slot_b and not uninit and ({bare_a} or {bare_b}) as bare
      from pair_t
    ), c as (
      select * replace (uninit or bare as uninit) from c0
    ), r as (
      select c.*, ctx.ctx,
        greatest(coalesce(ctx.ctx, 0), coalesce(ctx.ctx_norm, 0)) as noise_mag,
        greatest({eps_sql("c.dtype_a")}, {eps_sql("c.dtype_b")})
          * greatest(coalesce(ctx.ctx, 0), coalesce(ctx.ctx_norm, 0)) as noise_ref,
        max_b - max_a as max_diff, min_b - min_a as min_diff, mean_b - mean_a as mean_diff,
        norm_b - norm_a as norm_diff,
        abs(max_b - max_a) / nullif(abs(max_a), 0) as max_rel,
        abs(min_b - min_a) / nullif(abs(min_a), 0) as min_rel,
        abs(mean_b - mean_a) / nullif(abs(mean_a), 0) as mean_rel,
        abs(norm_b - norm_a) / nullif(abs(norm_a), 0) as norm_rel,
        greatest(coalesce(c.mag, 0), {CONTEXT_FLOOR} * coalesce(ctx.ctx, 0), 1e-30) as sref,
        greatest(abs(coalesce(norm_a, 0)), abs(coalesce(norm_b, 0)), {CONTEXT_FLOOR} * coalesce(ctx.ctx, 0), 1e-30) as nref
      from c left join row_ctx ctx on ctx.grp_a is not distinct from c.grp_a and ctx.grp_b is not distinct from c.grp_b
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
        greatest({pass_a}, {pass_b}) as tol_pass, greatest({warn_a}, {warn_b}) as tol_warn,
        coalesce(not nonfinite_a and not nonfinite_b and mag is not null and noise_ref > 0
                 and mag <= {NOISE_ULPS} * noise_ref, false) as noise
      from r
    )
    select row_id, max_diff, min_diff, mean_diff, norm_diff, max_rel, min_rel, mean_rel, norm_rel, err,
      case when hash_a is not null and hash_b is not null then hash_a = hash_b end as hash_match,
      ctx, tol_pass, tol_warn, name_slot_a and name_slot_b and (uninit or noise) as settled,
      {tensor_verdict_sql("name_slot_a", "name_slot_b")} as verdict,
      case when not name_slot_a or not name_slot_b then match_reason
           when bare then printf('no statistics in %s (memory not read: uninitialised, freed, or a dtype '
                                 'without statistics): not compared',
                                 case when {bare_a} and {bare_b} then 'either run' when {bare_a} then 'A' else 'B' end)
           when uninit then 'uninitialised memory (an empty tensor): not compared'
           when nonfinite_a and not nonfinite_b then 'NaN/Inf only in A'
           when nonfinite_b and not nonfinite_a then 'NaN/Inf only in B'
           when numel_a is not null and numel_b is not null and numel_a <> numel_b then
                printf('shapes differ: %s vs %s', shape_a::varchar, shape_b::varchar)
           when hash_a is not null and hash_a = hash_b then 'identical (md5)'
           when nonfinite_a and nonfinite_b and err = 0 then 'NaN/Inf identical in both'
           when noise and err > tol_pass then
                printf('rounding noise: |values| <= %.2e in both, within %g eps(%s) of the magnitude around it '
                       '(%.2e; zero in exact arithmetic)', mag, {NOISE_ULPS}, coalesce(dtype_a, dtype_b, '?'),
                       noise_mag)
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


_GRADE_SQL = _grade_sql()
