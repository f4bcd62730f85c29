"""Localisation: the first divergence and the first NaN/Inf, as queries over the node pairs.

- **first divergence**: in forward execution (completion) order, the first matched node whose
  outputs (or parameters) diverge while its inputs do not, or whose error grows at least
  ``GROWTH``-fold from inputs to outputs, or that reads a diverged leaf input (``leaf_verdict``:
  made by no earlier call, a parameter or the data; at API level a weight is an input); errors
  first, then warnings; when the forward pass is clean, the same in backward order. When no
  node qualifies yet some diverge (graded on their inputs alone), the first of those: the
  headline never says "none" beside a divergence.
- **first NaN/Inf**: the first node whose outputs hold NaN/±Inf that none of its inputs hold,
  in either run (forward, then backward). Non-finite values that both runs hold identically at
  the same node (an attention mask's −inf) are not a finding.

Both are ``None`` or ``{"a": <name in A>, "b": <name in B>, "direction": ..., "reason": ...}``.

And per node (:func:`with_impact`), so that a divergence passed on is told from one made: a
node pair whose own verdict (:mod:`probe.compare.verdict`) is not ``pass`` is an **origin** when its
inputs agree (for ``nan``: hold no one-sided NaN/Inf), its parameters differ, or its error
grows ``GROWTH``-fold from inputs to outputs, or it reads a diverged leaf input; otherwise it is **affected**, and names the first
origin before it in execution order (of a ``nan`` node: the first ``nan`` origin). When the
forward pass has an origin, the backward pass has none of its own: its gradients are computed
from the diverged activations, so every backward node that diverges is affected by it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["localise", "with_impact", "GROWTH"]

#: An output error this many times the input error counts as growth even when inputs differ.
GROWTH = 10.0


def localise(con: Any, nodes: pa.Table) -> dict[str, Any]:
    """``{"first_divergence": ..., "first_nan": ...}`` of the node rows ``nodes`` (pyarrow.Table,
    :func:`with_impact`'s or :func:`probe.compare.node_rows.node_rows`'), queried on ``con``."""
    from probe.compare.tables import registered

    with registered(con, nodes=nodes):
        return {"first_divergence": _first_divergence(con), "first_nan": _first_nan(con)}


#: Match methods of a node paired with its own counterpart (the others have no inputs of
#: their own compared: a stand-in's verdict, or none).
_DIRECT = "match_method not in ('unmatched', 'ancestor', 'container')"
_BAD = "verdict in ('warning', 'error', 'nan')"


def with_impact(con: Any, nodes: pa.Table) -> pa.Table:
    """``nodes`` (the node rows, pyarrow.Table, in execution order) with ``origin`` (bool: a
    divergence starts here) and ``affected_by_a``, ``affected_by_b`` (the names of the origin an
    affected node's divergence comes from, null when none precedes it). The origins are one
    DuckDB projection; the first of them is every later affected node's source (numpy)."""
    import numpy as np

    from probe.compare.tables import registered

    with registered(con, nodes_in=nodes):
        flags = con.sql(f"""
    select coalesce({_DIRECT} and {_BAD} and case when verdict = 'nan'
             then coalesce(in_verdict, 'pass') <> 'nan'
             else coalesce(in_verdict, 'pass') = 'pass' or coalesce(param_verdict, 'pass') <> 'pass'
                  or leaf_verdict is not null
                  or coalesce(out_err, 0) >= {GROWTH} * coalesce(in_err, 0) end, false) as raw,
      coalesce(direction = 'forward', false) as fwd, coalesce({_DIRECT} and {_BAD}, false) as bad,
      coalesce(verdict = 'nan', false) as nan
    from nodes_in""").fetchnumpy()                  # a projection: DuckDB keeps the rows' order
    raw, fwd, bad, nan = (np.asarray(flags[k], dtype=bool) for k in ("raw", "fwd", "bad", "nan"))
    origin = raw & (fwd | ~(raw & fwd).any())        # a forward origin: backward has none of its own
    n = nodes.num_rows

    def first(mask: Any) -> int:
        return int(np.argmax(mask)) if mask.any() else n
    source = np.where(nan, first(origin & nan), first(origin))
    affected = bad & ~origin & (source < np.arange(n))
    named = _named_origins(nodes, np.minimum(source, max(n - 1, 0)), origin)
    take = pa.array(named, mask=~affected)
    table = nodes.append_column("origin", pa.array(origin))
    for side in ("a", "b"):
        table = table.append_column(f"affected_by_{side}", nodes.column(f"node_{side}").take(take))
    return table


def _named_origins(nodes: pa.Table, source: Any, origin: Any) -> Any:
    """``source`` (each node's origin, a row index) with an origin that is a call reading its
    module's own diverged parameter (``leaf_verdict`` set, its parent's ``param_verdict`` not
    pass) replaced by that module's row: what the headline names (:func:`_owner_of_leaf`), so
    the graph's "affected by" and the first divergence say the same node."""
    import numpy as np

    names = nodes.column("node_a").to_pylist()
    parents = nodes.column("parent_a").to_pylist() if "parent_a" in nodes.column_names else None
    if parents is None:
        return source
    leaf = nodes.column("leaf_verdict").to_pylist()
    param = nodes.column("param_verdict").to_pylist()
    direction = nodes.column("direction").to_pylist()
    row_of = {(nm, d): i for i, (nm, d) in enumerate(zip(names, direction)) if nm is not None}
    owner: dict[int, int] = {}
    for i in {int(k) for k in np.unique(source)}:
        if not origin[i] or leaf[i] in (None, "pass") or parents[i] is None:
            continue
        j = row_of.get((parents[i], direction[i]))
        if j is not None and param[j] not in (None, "pass"):
            owner[i] = j
    if not owner:
        return source
    return np.array([owner.get(int(k), int(k)) for k in source], dtype=source.dtype)


def _finding(row: tuple | None) -> dict[str, Any] | None:
    if row is None:
        return None
    a, b, direction, reason = row
    return {"a": a, "b": b, "direction": direction, "reason": reason}


def _first_divergence(con: Any) -> dict[str, Any] | None:
    for direction in ("forward", "backward"):
        for levels in ("('error', 'nan')", "('warning')"):   # one-sided NaN/Inf: the error level
            row = con.execute(f"""
            select node_a, node_b, direction, reason from nodes
            where direction = '{direction}' and match_method not in ('unmatched', 'ancestor')
              and (out_verdict in {levels} or param_verdict in {levels} or leaf_verdict in {levels})
              and (coalesce(in_verdict, 'pass') = 'pass'
                   or coalesce(out_err, 0) >= {GROWTH} * coalesce(in_err, 0)
                   or param_verdict in {levels} or leaf_verdict in {levels})
            order by ord, node_a nulls last, node_b nulls last limit 1""").fetchall()
            if row:
                return _finding(_owner_of_leaf(con, row[0], levels) or row[0])
    # no origin found, yet nodes diverge (graded on their inputs alone, ...): the first of them,
    # so that the headline never says "none" beside an error
    row = con.execute(f"""
    select node_a, node_b, direction, reason from nodes
    where {_DIRECT} and verdict in ('warning', 'error', 'nan')
    order by case when verdict = 'warning' then 1 else 0 end, direction <> 'forward', ord,
      node_a nulls last, node_b nulls last limit 1""").fetchall()
    return _finding(row[0]) if row else None


def _owner_of_leaf(con: Any, row: tuple, levels: str) -> tuple | None:
    """The module whose own parameter a call inside it reads, when that is how the call
    diverges: a mix-level dump names the module (``Module.layers.1.mlp.down_proj...``) rather
    than the ``Functional.linear`` inside it that reads its weight; None otherwise (an API-level
    dump has no module to name: the call is the answer)."""
    found = con.execute(f"""
    select p.node_a, p.node_b, p.direction, p.reason from nodes c
    join nodes p on p.node_a = c.parent_a and p.direction = c.direction
    where c.node_a = ? and c.direction = ? and c.leaf_verdict in {levels}
      and p.param_verdict in {levels} and p.match_method not in ('unmatched', 'ancestor')
    limit 1""", [row[0], row[2]]).fetchall()
    return found[0] if found else None


def _first_nan(con: Any) -> dict[str, Any] | None:
    for direction in ("forward", "backward"):
        row = con.execute(f"""
        with c as (
          select node_a, node_b, direction, ord, match_method, out_verdict,
            coalesce(nonfinite_out_a, false) and not coalesce(nonfinite_in_a, false) as new_a,
            coalesce(nonfinite_out_b, false) and not coalesce(nonfinite_in_b, false) as new_b,
            coalesce(nonfinite_out_a, false) and coalesce(nonfinite_out_b, false)
              and coalesce(out_verdict, 'pass') = 'pass' as shared
          from nodes where direction = '{direction}'
        )
        select node_a, node_b, direction,
          case when new_a and new_b then 'NaN/Inf first appear here in both runs (not identically)'
               when new_a then 'NaN/Inf first appear here in A, not produced by its inputs'
               else 'NaN/Inf first appear here in B, not produced by its inputs' end
        from c where (new_a or new_b) and not shared
        order by ord, node_a nulls last, node_b nulls last limit 1""").fetchall()
        if row:
            return _finding(row[0])
    return None
