"""The compare pipeline over two loaded dumps: normalise → match → metrics → verdicts → localise.

Everything row-wise is a DuckDB query over Arrow tables; Python touches only the groups left
unmatched by name (structural alignment) and the tensor files of tensor-mode dumps.

>>> from compare.load import load_dump                                  # doctest: +SKIP
>>> r = run_compare(load_dump("A/dump.json"), load_dump("B/dump.json"))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from compare.api import CompareResult
from compare.load import Dump
from compare.verdict import CONTEXT_FLOOR, tolerance_sql

__all__ = ["run_compare", "compare_paths"]


def run_compare(da: Dump, db: Dump, mapping: str | None = None, bar: Any = None,
                out: Any = None) -> CompareResult:
    """Compare two loaded dumps; see :mod:`compare.api` for the result's columns. With ``out``
    (a folder) the result files are written there as their parts are ready."""
    con = _connect()
    side_a = _Normaliser(con, "a", da).start()
    try:
        _Normaliser(con, "b", db).run()
    finally:
        side_a.join()
    _tick(bar, "normalised")
    return _finish(con, da, db, mapping, bar, out)


def compare_paths(a: str, b: str, mapping: str | None = None, bar: Any = None,
                  out: Any = None) -> CompareResult:
    """Read and compare two inputs, overlapping the work of the two sides on two cores.

    B is read in a worker process when the inputs are large (:func:`compare.load.start_load`),
    and A's records are normalised on a DuckDB cursor in a thread (DuckDB runs without the GIL)
    while B is read or received here. Errors are A's first, then B's.
    """
    from concurrent.futures import ThreadPoolExecutor

    from compare.load import load_dump, start_load

    pending = start_load(a, b)
    side_a = None
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="compare-connect") as pool:
            connecting = pool.submit(_connect)       # while A is read (the scanner frees the GIL)
            da = load_dump(a)
            _tick(bar, "read A")
            con = connecting.result()
        side_a = _Normaliser(con, "a", da).start()
        db = pending.result()
        _tick(bar, "read B")
        _Normaliser(con, "b", db).run()
    finally:
        pending.close()
        if side_a is not None:
            side_a.join()
    _tick(bar, "normalised")
    return _finish(con, da, db, mapping, bar, out)


#: Tensor rows of both sides together from which DuckDB runs each query on every core. Below
#: it a query runs on one thread (a table of fewer rows than a few row groups of 122,880 gains
#: less from DuckDB's threads than their coordination costs) and the parallelism is ours: the
#: two sides normalised at once, the rows query in two halves.
DUCKDB_PARALLEL_ROWS = 1_000_000


def _connect() -> Any:
    """The compare's in-memory DuckDB, one thread per query until :func:`_size_threads`."""
    import duckdb

    return duckdb.connect(config={"threads": 1})


def _size_threads(con: Any, rows: int) -> int:
    """Give DuckDB every core when the inputs are large; returns its thread count."""
    threads = os.cpu_count() or 1
    if rows >= DUCKDB_PARALLEL_ROWS and threads > 1:
        con.execute(f"set threads = {threads}")
        return threads
    return 1


class _Normaliser:
    """:func:`compare.normalize.normalise_side` of one side on its own cursor, here or in a thread."""

    def __init__(self, con: Any, side: str, dump: Dump) -> None:
        self.cursor = con.cursor()
        self.side = side
        self.dump = dump
        self.thread: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from compare.normalize import normalise_side

        try:
            normalise_side(self.cursor, self.side, self.dump.tensors, self.dump.nodes)
        finally:
            self.cursor.close()

    def _run_caught(self) -> None:
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 - re-raised by join() on the caller's thread
            self.error = e

    def start(self) -> "_Normaliser":
        import threading

        self.thread = threading.Thread(target=self._run_caught, name=f"normalise-{self.side}",
                                       daemon=True)
        self.thread.start()
        return self

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error


def _finish(con: Any, da: Dump, db: Dump, mapping: str | None, bar: Any,
            out: Any = None) -> CompareResult:
    """Match, metrics, verdicts and localisation over the two normalised sides; the result's
    files are written to ``out`` (when given) while the later parts are computed."""
    from concurrent.futures import ThreadPoolExecutor

    from compare.localize import localise
    from compare.match import match_groups
    from compare.metrics import add_tensor_metrics
    from compare.report import ResultWriter, build_summary

    writer = ResultWriter(out) if out is not None else None
    # both sides' tensor names are built in Arrow (no GIL) while the matching runs in DuckDB
    naming = ThreadPoolExecutor(2, thread_name_prefix="compare-names")
    names_a = naming.submit(_tensor_names, da.tensors)
    names_b = naming.submit(_tensor_names, db.tensors)
    naming.shutdown(wait=False)
    try:
        mapped = None
        if mapping:
            from compare.mapping import mapped_pairs

            mapped = mapped_pairs(con, mapping)
        match_groups(con, mapped, structural=mapped is None)
        _tick(bar, "matched")
        n = da.tensors.num_rows + db.tensors.num_rows
        single = _size_threads(con, n) == 1
        full = _rows(con, 2 if single and n >= PARTITION_ROWS and (os.cpu_count() or 1) >= 2 else 1)
        full = _with_names(full, (names_a.result(), names_b.result()))
        rows = full.drop_columns(list(_HELPERS))
        if da.task == "tensor" or db.task == "tensor":
            rows = add_tensor_metrics(rows, progress=bar is not None and getattr(bar, "enabled", False))
            for k in ("err", "verdict", "reason"):
                full = full.set_column(full.schema.get_field_index(k), k, rows.column(k))
        if writer is not None:
            writer.rows(rows)
        con.register("rows", full)
        _tick(bar, "metrics")
        nodes = con.sql(_nodes(con)).to_arrow_table()
        if writer is not None:
            writer.nodes(nodes)
        con.register("nodes", nodes)
        _tick(bar, "verdicts")
        summary = build_summary(con, da, db)
        summary.update(localise(con))
        _tick(bar, "localised")
        con.close()
        result = CompareResult(rows=rows, nodes=nodes, summary=summary)
        if writer is not None:
            result.written = writer.finish(summary)
            writer = None
        return result
    finally:
        if writer is not None:
            writer.close()


def _tick(bar: Any, what: str) -> None:
    if bar is not None:
        bar.step(what)


#: Columns of the rows query that later queries use but the result does not show.
_HELPERS = ("grp_a", "grp_b", "ctx", "tol_pass", "tol_warn", "uninit")


#: Rows of both sides together from which the rows query, when DuckDB runs it on one thread,
#: runs as two halves on two threads instead.
PARTITION_ROWS = 16_384


def _rows(con: Any, parts: int = 1) -> Any:
    """The per-tensor rows (pyarrow.Table, in execution order, with the helper columns).

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


def _tensor_names(tensors: Any) -> tuple[Any, Any]:
    """(msprobe tensor names, entry names) of one side's tensor records, by record position
    (``Module.fc.Linear.forward.0.input.0``, ``...parameters.weight``), built in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    node = tensors.column("node").combine_chunks()
    slot = tensors.column("slot").combine_chunks()
    keys = pa.array(list(_NAME_SEP), type=pa.string())
    seps = pa.array(list(_NAME_SEP.values()), type=pa.string())
    sep = pc.fill_null(seps.take(pc.index_in(slot, value_set=keys)), ".")
    name = pc.binary_join_element_wise(node, sep, tensors.column("index").combine_chunks(), "")
    return name, node


def _with_names(full: Any, names: tuple) -> Any:
    """The rows with both sides' tensor and entry names put in from the records by position
    (the query carries positions, not these long strings: a quarter of its time at 20k), and
    the reason of the pairs that agree. ``names``: :func:`_tensor_names` of A, then of B."""
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
      ta.node is not null as name_slot_a, tb.node is not null as name_slot_b,
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
      case when not name_slot_a or not name_slot_b then 'unmatched'
           when uninit then 'pass'
           when nonfinite_a is distinct from nonfinite_b then 'error'
           when numel_a is not null and numel_b is not null and numel_a <> numel_b then 'error'
           when hash_a is not null and hash_a = hash_b then 'pass'
           when err <= tol_pass then 'pass'
           when err <= tol_warn then 'warning'
           else 'error' end as verdict,
      case when not name_slot_a or not name_slot_b then match_reason
           when uninit then 'uninitialised memory (an empty tensor): not compared'
           when nonfinite_a and not nonfinite_b then 'NaN/Inf only in A'
           when nonfinite_b and not nonfinite_a then 'NaN/Inf only in B'
           when numel_a is not null and numel_b is not null and numel_a <> numel_b then
                printf('shapes differ: %s vs %s', shape_a::varchar, shape_b::varchar)
           when hash_a is not null and hash_a = hash_b then 'identical (md5)'
           when nonfinite_a and nonfinite_b and err = 0 then 'NaN/Inf identical in both'
           when err <= tol_pass then null     -- 'agrees within the <dtype> tolerance': _with_names
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


def _worst(cond: str) -> str:
    """SQL: the worst verdict over the rows matching ``cond``."""
    return ("case max(case verdict when 'error' then 2 when 'warning' then 1 when 'pass' then 0 end) "
            f"filter (where {cond}) when 2 then 'error' when 1 then 'warning' when 0 then 'pass' end")


def _nodes(con: Any) -> str:
    """Build the per-node tables; return the query of the node pairs (in execution order)."""
    con.execute(f"""
    create or replace table pair_nodes as
    select grp_a, grp_b, direction, any_value(node_a) filter (where node_a is not null) as node_a,
      any_value(node_b) filter (where node_b is not null) as node_b,
      max(err) filter (where slot in ('input', 'kwarg')) as in_err,
      max(err) filter (where slot = 'output') as out_err,
      max(err) filter (where slot in ('parameter', 'parameter_grad')) as param_err,
      {_worst("slot in ('input', 'kwarg')")} as in_verdict,
      {_worst("slot = 'output'")} as out_verdict,
      {_worst("slot in ('parameter', 'parameter_grad')")} as param_verdict,
      arg_max(reason, [coalesce(err, -1), -row_id]) filter (where slot = 'output') as out_reason,
      arg_max(name_a, [coalesce(err, -1), -row_id]) filter (where slot in ('parameter', 'parameter_grad')) as worst_param,
      max(tol_pass) as tol_pass,
      -- NaN/Inf in each side's entry: every tensor of it is a row of its group (matched or not)
      bool_or(nonfinite_a) filter (where slot in ('input', 'kwarg')) as nf_in_a,
      bool_or(nonfinite_a) filter (where slot = 'output') as nf_out_a,
      bool_or(nonfinite_b) filter (where slot in ('input', 'kwarg')) as nf_in_b,
      bool_or(nonfinite_b) filter (where slot = 'output') as nf_out_b
    from rows where grp_a is not null and grp_b is not null group by grp_a, grp_b, direction
    """)
    # the node pairs (and below, the sources of the node query that are unions or cross joins)
    # are tables of their own before they meet a hash join: DuckDB 2.0 fails a hash join whose
    # build side is a cross join ("dict-surviving join ... build pipeline is not single-source",
    # an internal error) once the group keys are integers
    con.execute("""
    create or replace table node_pairs as
      select p.grp_a, p.grp_b, p.method, p.reason as mreason, d.direction,
        case d.direction when 'forward' then ga.fwd else coalesce(ga.bwd, ga.pgrad) end as node_a,
        case d.direction when 'forward' then gb.fwd else coalesce(gb.bwd, gb.pgrad) end as node_b,
        ga.kind, ga.cls as class_a, gb.cls as class_b, ga.parent_node as parent_a, gb.parent_node as parent_b,
        case d.direction when 'forward' then ga.ord_f else ga.ord_b + 1000000000 end as order_a,
        case d.direction when 'forward' then gb.ord_f else gb.ord_b + 1000000000 end as order_b
      from pairs p join a_g ga on ga.grp = p.grp_a join b_g gb on gb.grp = p.grp_b
      cross join (values ('forward'), ('backward')) d(direction)
    """)
    con.execute("""
    create or replace table both_g as
    select 'a' as sd, * from a_g union all select 'b', * from b_g
    """)
    con.execute("""
    create or replace table cov as
    select c.side, c.grp, c.anc_a, c.anc_b, d.direction, ga.kind as kind_a, gb.kind as kind_b
    from covered c cross join (values ('forward'), ('backward')) d(direction)
    left join a_g ga on c.side = 'a' and ga.grp = c.grp
    left join b_g gb on c.side = 'b' and gb.grp = c.grp
    """)
    con.execute("""
    create or replace table nodes_all as
    select e.*, pn.in_err, pn.out_err, pn.param_err, pn.in_verdict, pn.out_verdict, pn.param_verdict,
      pn.out_reason, pn.worst_param, pn.nf_in_a, pn.nf_out_a, pn.nf_in_b, pn.nf_out_b
    from node_pairs e left join pair_nodes pn on pn.grp_a = e.grp_a and pn.grp_b = e.grp_b and pn.direction = e.direction
    where e.node_a is not null or e.node_b is not null
    """)
    return """
    with m as (
      select n.*,
        case when coalesce(param_verdict, 'pass') = 'error' or coalesce(out_verdict, 'pass') = 'error' then 'error'
             when coalesce(param_verdict, 'pass') = 'warning' or coalesce(out_verdict, 'pass') = 'warning' then 'warning'
             when out_verdict is null and param_verdict is null then coalesce(in_verdict, 'pass')
             else 'pass' end as verdict,
        greatest(0.0, least(1.0, coalesce(out_err, 0)) - least(1.0, coalesce(in_err, 0))) as precision_score
      from nodes_all n
    )
    select m.node_a, m.node_b, m.kind, m.class_a, m.class_b, m.parent_a, m.parent_b, m.direction,
      m.method as match_method,
      order_a, order_b, order_a as ord, in_err, out_err, param_err, in_verdict, out_verdict, param_verdict,
      precision_score,
      case when precision_score >= 0.6 then 'high' when precision_score >= 0.3 then 'medium' else 'low' end as precision_band,
      nf_in_a as nonfinite_in_a, nf_out_a as nonfinite_out_a, nf_in_b as nonfinite_in_b, nf_out_b as nonfinite_out_b,
      verdict,
      case when verdict = 'pass' then mreason || '; outputs agree'
           when coalesce(param_verdict, 'pass') <> 'pass' then mreason || '; parameter ' || coalesce(worst_param, '?') || ' differs; ' || coalesce(out_reason, '')
           else mreason || '; output ' || coalesce(out_reason, '') end as reason
    from m
    union all
    select case when c.side = 'a' then (case c.direction when 'forward' then ga.fwd else coalesce(ga.bwd, ga.pgrad) end)
                else (case c.direction when 'forward' then pa.fwd else coalesce(pa.bwd, pa.pgrad) end) end,
           case when c.side = 'b' then (case c.direction when 'forward' then gb.fwd else coalesce(gb.bwd, gb.pgrad) end)
                else (case c.direction when 'forward' then pb.fwd else coalesce(pb.bwd, pb.pgrad) end) end,
      coalesce(ga.kind, gb.kind), ga.cls, gb.cls, ga.parent_node, gb.parent_node, c.direction, 'ancestor',
      case when c.side = 'a' then (case c.direction when 'forward' then ga.ord_f else ga.ord_b + 1000000000 end) end,
      case when c.side = 'b' then (case c.direction when 'forward' then gb.ord_f else gb.ord_b + 1000000000 end) end,
      coalesce(case c.direction when 'forward' then coalesce(ga.ord_f, gb.ord_f) else coalesce(ga.ord_b, gb.ord_b) + 1000000000 end, 0),
      null, null, null, null, null, null, null, null, null, null, null, null,
      coalesce(an.verdict, 'pass'),
      printf('no counterpart in %s (fused/unfused structure); compared at the nearest common ancestor %s <-> %s',
             case c.side when 'a' then 'B' else 'A' end, pa.fwd, pb.fwd)
    from cov c
    left join a_g ga on c.side = 'a' and ga.grp = c.grp
    left join b_g gb on c.side = 'b' and gb.grp = c.grp
    join a_g pa on pa.grp = c.anc_a join b_g pb on pb.grp = c.anc_b
    left join m an on an.grp_a = c.anc_a and an.grp_b = c.anc_b and an.direction = c.direction
    where (case when c.side = 'a' then (case c.direction when 'forward' then ga.fwd else coalesce(ga.bwd, ga.pgrad) end)
                else (case c.direction when 'forward' then gb.fwd else coalesce(gb.bwd, gb.pgrad) end) end) is not null
    union all
    select case when k.side = 'a' then (case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end) end,
      case when k.side = 'b' then (case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end) end,
      g.kind, case when k.side = 'a' then g.cls end, case when k.side = 'b' then g.cls end,
      case when k.side = 'a' then g.parent_node end, case when k.side = 'b' then g.parent_node end,
      d.direction, 'container',
      case when k.side = 'a' then (case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end) end,
      case when k.side = 'b' then (case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end) end,
      case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end,
      null, null, null, null, null, null, null, null, null, null, null, null,
      coalesce((select case max(case verdict when 'error' then 2 when 'warning' then 1 else 0 end)
                  when 2 then 'error' when 1 then 'warning' else 'pass' end
                from m where m.direction = d.direction
                  and (case k.side when 'a' then m.grp_a else m.grp_b end) in
                      (select c.grp from both_g c where c.sd = k.side and c.parent = k.grp)), 'pass'),
      printf('a container level only in %s (no counterpart, its children are matched)',
             case k.side when 'a' then 'A' else 'B' end)
    from containers k
    join both_g g on g.sd = k.side and g.grp = k.grp
    cross join (values ('forward'), ('backward')) d(direction)
    where (case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end) is not null
    union all
    select case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end, null, g.kind, g.cls, null,
      g.parent_node, null, d.direction, 'unmatched',
      case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end, null,
      case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end,
      null, null, null, null, null, null, null, null, null, null, null, null, 'unmatched', 'no counterpart in B'
    from a_g g join a_st st on st.grp = g.grp and st.state = 'unmatched'
    cross join (values ('forward'), ('backward')) d(direction)
    where (case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end) is not null
    union all
    select null, case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end, g.kind, null, g.cls,
      null, g.parent_node, d.direction, 'unmatched', null,
      case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end,
      case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end,
      null, null, null, null, null, null, null, null, null, null, null, null, 'unmatched', 'no counterpart in A'
    from b_g g join b_st st on st.grp = g.grp and st.state = 'unmatched'
    cross join (values ('forward'), ('backward')) d(direction)
    where (case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end) is not null
    order by ord, node_a nulls last, node_b nulls last, direction
    """
