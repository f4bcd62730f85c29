"""The per-node rows of a compare (``CompareResult.nodes``): node pairs and their verdicts.

Two stages, DuckDB SQL over pyarrow.Tables registered on the connection each is given:
:func:`node_frame` (the sides' call groups and the :class:`probe.compare.match.Matches`: what
needs no tensor rows, a :class:`NodeFrame`) and :func:`node_rows` (the same, the frame and the
tensor rows of :func:`probe.compare.tensor_rows.tensor_rows`: the node rows):

1. each matched group pair, per direction, gets the worst error and verdict of its inputs,
   outputs and parameters, and whether NaN/Inf are in each side's inputs and outputs;
2. its node verdict is the worst of its own tensors' (:mod:`probe.compare.verdict` defines both), its
   precision score the growth of the error from inputs to outputs (each clipped at 1),
   floored at 0;
3. the groups without a counterpart are added: ``ancestor`` (compared at the nearest matched
   ancestor, taking its verdict), ``container`` (an extra wrapper level of one side, taking
   its children's worst verdict) and ``unmatched``; all in execution order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from probe.compare.match import Matches
from probe.compare.tables import registered
from probe.compare.verdict import node_verdict_sql, worst_sql

__all__ = ["NodeFrame", "node_frame", "node_rows"]


@dataclass
class NodeFrame:
    """The parts of the node rows that need only the matched groups (:func:`node_frame`):
    ``node_pairs`` (each group pair per direction, with its entries, classes, parents and
    order), ``both_g`` (the containers' groups and their children, both sides) and ``cov``
    (each ``ancestor`` group per direction, with its pair and kind)."""

    node_pairs: pa.Table
    both_g: pa.Table
    cov: pa.Table


def node_frame(con: Any, groups_a: pa.Table, groups_b: pa.Table, matches: Matches) -> NodeFrame:
    """The node tables that need only the matched groups, not the tensor rows (built while the
    rows are, on a cursor of their own), for :func:`node_rows`."""
    # the node pairs (and the other sources of the node query that are unions or cross joins)
    # are tables of their own (Arrow) before they meet a hash join: DuckDB 2.0 fails a hash join whose
    # build side is a cross join ("dict-surviving join ... build pipeline is not single-source",
    # an internal error) once the group keys are integers
    with registered(con, a_g=groups_a, b_g=groups_b, pairs=matches.pairs, covered=matches.covered,
                    containers=matches.containers):
        return NodeFrame(*(con.sql(q).to_arrow_table() for q in (_NODE_PAIRS, _BOTH_G, _COV)))


_NODE_PAIRS = """
      select p.grp_a, p.grp_b, p.method, p.reason as mreason, d.direction,
        case d.direction when 'forward' then ga.fwd else coalesce(ga.bwd, ga.pgrad) end as node_a,
        case d.direction when 'forward' then gb.fwd else coalesce(gb.bwd, gb.pgrad) end as node_b,
        ga.kind, ga.cls as class_a, gb.cls as class_b, ga.parent_node as parent_a, gb.parent_node as parent_b,
        case d.direction when 'forward' then ga.ord_f else ga.ord_b + 1000000000 end as order_a,
        case d.direction when 'forward' then gb.ord_f else gb.ord_b + 1000000000 end as order_b
      from pairs p join a_g ga on ga.grp = p.grp_a join b_g gb on gb.grp = p.grp_b
      cross join (values ('forward'), ('backward')) d(direction)
"""
#: the groups the containers' part reads: the containers and their children
_BOTH_G = """
    select 'a' as sd, * from a_g
    where grp in (select grp from containers where side = 'a') or parent in (select grp from containers where side = 'a')
    union all
    select 'b', * from b_g
    where grp in (select grp from containers where side = 'b') or parent in (select grp from containers where side = 'b')
"""
_COV = """
    select c.side, c.grp, c.anc_a, c.anc_b, d.direction, ga.kind as kind_a, gb.kind as kind_b
    from covered c cross join (values ('forward'), ('backward')) d(direction)
    left join a_g ga on c.side = 'a' and ga.grp = c.grp
    left join b_g gb on c.side = 'b' and gb.grp = c.grp
"""


def node_rows(con: Any, rows: pa.Table, groups_a: pa.Table, groups_b: pa.Table, matches: Matches,
              frame: NodeFrame) -> pa.Table:
    """The per-node rows (pyarrow.Table, in execution order; columns: :mod:`probe.compare.result`)
    from the tensor rows ``rows`` (:func:`probe.compare.tensor_rows.tensor_rows`, with its
    helper columns), the sides' call groups, the matches and :func:`node_frame`'s tables,
    queried on ``con``."""
    with registered(con, rows=rows, a_g=groups_a, b_g=groups_b, a_st=matches.state_a,
                    b_st=matches.state_b, containers=matches.containers, node_pairs=frame.node_pairs,
                    both_g=frame.both_g, cov=frame.cov):
        return _in_order(con, _nodes(con))


def _nodes(con: Any) -> pa.Table:
    """The node rows in no particular order (see the module docstring)."""
    # each matched pair's worst tensors (1) and the pairs with them: parts of the query that
    # reads them (as tables of their own, writing their columns cost 100k entries 0.07 s more)
    return con.sql(f"""
    with leaf_in as (
      -- the diverged forward inputs that no earlier call made (a leaf: a parameter, the data):
      -- on neither side does an earlier output hold the same statistics
      select grp_a, grp_b, direction, {worst_sql("true")} as leaf_verdict,
        arg_max(name_a, {{'e': coalesce(err, -1), 'r': -row_id}}) as leaf_name,
        arg_max(reason, {{'e': coalesce(err, -1), 'r': -row_id}}) as leaf_reason
      from rows i
      where i.direction = 'forward' and i.slot in ('input', 'kwarg') and i.verdict in ('warning', 'error', 'nan')
        and i.grp_a is not null and i.grp_b is not null
        and not exists (select 1 from rows o where o.direction = 'forward' and o.slot = 'output' and o.ord < i.ord
                          and o.max_a is not distinct from i.max_a and o.min_a is not distinct from i.min_a
                          and o.mean_a is not distinct from i.mean_a and o.norm_a is not distinct from i.norm_a
                          and o.shape_a is not distinct from i.shape_a)
        and not exists (select 1 from rows o where o.direction = 'forward' and o.slot = 'output' and o.ord < i.ord
                          and o.max_b is not distinct from i.max_b and o.min_b is not distinct from i.min_b
                          and o.mean_b is not distinct from i.mean_b and o.norm_b is not distinct from i.norm_b
                          and o.shape_b is not distinct from i.shape_b)
      group by all
    ), pair_nodes as (
      select grp_a, grp_b, direction,
      max(err) filter (where slot in ('input', 'kwarg')) as in_err,
      max(err) filter (where slot = 'output') as out_err,
      max(err) filter (where slot in ('parameter', 'parameter_grad')) as param_err,
      {worst_sql("slot in ('input', 'kwarg')")} as in_verdict,
      {worst_sql("slot = 'output'")} as out_verdict,
      {worst_sql("slot in ('parameter', 'parameter_grad')")} as param_verdict,
      -- the worst row's (the first of equals); a struct key, which DuckDB compares as it
      -- would the list [err, -row_id] in 60% of the time (100k entries: 0.12 -> 0.07 s)
      arg_max(reason, {{'e': coalesce(err, -1), 'r': -row_id}}) filter (where slot = 'output') as out_reason,
      arg_max(name_a, {{'e': coalesce(err, -1), 'r': -row_id}}) filter (where slot in ('input', 'kwarg')) as worst_in,
      arg_max(reason, {{'e': coalesce(err, -1), 'r': -row_id}}) filter (where slot in ('input', 'kwarg')) as in_reason,
      arg_max(name_a, {{'e': coalesce(err, -1), 'r': -row_id}}) filter (where slot in ('parameter', 'parameter_grad')) as worst_param,
      -- NaN/Inf in each side's entry: every tensor of it is a row of its group (matched or not)
      bool_or(nonfinite_a) filter (where slot in ('input', 'kwarg')) as nf_in_a,
      bool_or(nonfinite_a) filter (where slot = 'output') as nf_out_a,
      bool_or(nonfinite_b) filter (where slot in ('input', 'kwarg')) as nf_in_b,
      bool_or(nonfinite_b) filter (where slot = 'output') as nf_out_b
    from rows where grp_a is not null and grp_b is not null group by grp_a, grp_b, direction
    ), n as (
      select e.*, pn.in_err, pn.out_err, pn.param_err, pn.in_verdict, pn.out_verdict, pn.param_verdict,
        pn.out_reason, pn.worst_param, pn.worst_in, pn.in_reason, pn.nf_in_a, pn.nf_out_a, pn.nf_in_b, pn.nf_out_b,
        li.leaf_verdict, li.leaf_name, li.leaf_reason
      from node_pairs e left join pair_nodes pn on pn.grp_a = e.grp_a and pn.grp_b = e.grp_b and pn.direction = e.direction
      left join leaf_in li on li.grp_a = e.grp_a and li.grp_b = e.grp_b and li.direction = e.direction
      where e.node_a is not null or e.node_b is not null
    ), m as (
      select n.*,
        {node_verdict_sql("out_verdict", "param_verdict", "in_verdict")} as verdict,
        greatest(0.0, least(1.0, coalesce(out_err, 0)) - least(1.0, coalesce(in_err, 0))) as precision_score
      from n
    )
    select m.node_a, m.node_b, m.kind, m.class_a, m.class_b, m.parent_a, m.parent_b, m.direction,
      m.method as match_method,
      order_a, order_b, order_a as ord, in_err, out_err, param_err, in_verdict, out_verdict, param_verdict,
      precision_score,
      case when precision_score >= 0.6 then 'high' when precision_score >= 0.3 then 'medium' else 'low' end as precision_band,
      nf_in_a as nonfinite_in_a, nf_out_a as nonfinite_out_a, nf_in_b as nonfinite_in_b, nf_out_b as nonfinite_out_b,
      verdict,
      leaf_verdict,
      case when verdict = 'pass' then mreason || '; outputs agree'
           when coalesce(param_verdict, 'pass') <> 'pass' then mreason || '; parameter ' || coalesce(worst_param, '?') || ' differs'
                || case when coalesce(out_verdict, 'pass') <> 'pass' then '; output ' || coalesce(out_reason, '') else '' end
           when leaf_verdict is not null then mreason || '; input ' || leaf_name
                || ' differs, made by no earlier call (a leaf: a parameter or the data): ' || coalesce(leaf_reason, '')
           when coalesce(out_verdict, 'pass') <> 'pass' then mreason || '; output ' || coalesce(out_reason, '')
           else mreason || '; input ' || coalesce(worst_in, '?') || ' ' || coalesce(in_reason, '') end as reason
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
      coalesce(an.verdict, 'pass'), null,
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
      coalesce((select {worst_sql("true")}
                from m where m.direction = d.direction
                  and (case k.side when 'a' then m.grp_a else m.grp_b end) in
                      (select c.grp from both_g c where c.sd = k.side and c.parent = k.grp)), 'pass'), null,
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
      null, null, null, null, null, null, null, null, null, null, null, null, 'unmatched', null, 'no counterpart in B'
    from a_g g join a_st st on st.grp = g.grp and st.state = 'unmatched'
    cross join (values ('forward'), ('backward')) d(direction)
    where (case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end) is not null
    union all
    select null, case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end, g.kind, null, g.cls,
      null, g.parent_node, d.direction, 'unmatched', null,
      case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end,
      case d.direction when 'forward' then g.ord_f else g.ord_b + 1000000000 end,
      null, null, null, null, null, null, null, null, null, null, null, null, 'unmatched', null, 'no counterpart in A'
    from b_g g join b_st st on st.grp = g.grp and st.state = 'unmatched'
    cross join (values ('forward'), ('backward')) d(direction)
    where (case d.direction when 'forward' then g.fwd else coalesce(g.bwd, g.pgrad) end) is not null
    """).to_arrow_table()


def _in_order(con: Any, nodes: pa.Table) -> pa.Table:
    """The node rows in execution order (``ord``, then the names and direction): the sort keys
    alone sorted in DuckDB, the rows taken in that order in Arrow (an ORDER BY of the whole
    query moved every column through the sort)."""
    import numpy as np

    keys = nodes.select(["ord", "node_a", "node_b", "direction"]).append_column(
        "i", pa.array(np.arange(nodes.num_rows, dtype=np.int64)))
    with registered(con, node_keys=keys):
        order = con.sql("select i from node_keys order by ord, node_a nulls last, node_b nulls last, "
                        "direction").to_arrow_table().column(0)
    return nodes.take(order)
