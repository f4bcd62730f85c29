"""Localisation: the first divergence and the first NaN/Inf, as queries over the node pairs.

- **first divergence**: in forward execution (completion) order, the first matched node whose
  outputs (or parameters) diverge while its inputs do not, or whose error grows at least
  ``GROWTH``-fold from inputs to outputs; errors first, then warnings; when the forward pass
  is clean, the same in backward order.
- **first NaN/Inf**: the first node whose outputs hold NaN/±Inf that none of its inputs hold,
  in either run (forward, then backward). Non-finite values that both runs hold identically at
  the same node (an attention mask's −inf) are not a finding.

Both are ``None`` or ``{"a": <name in A>, "b": <name in B>, "direction": ..., "reason": ...}``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["localise", "GROWTH"]

#: An output error this many times the input error counts as growth even when inputs differ.
GROWTH = 10.0


def localise(con: Any) -> dict[str, Any]:
    """``{"first_divergence": ..., "first_nan": ...}`` from the ``nodes`` table in ``con``."""
    return {"first_divergence": _first_divergence(con), "first_nan": _first_nan(con)}


def _finding(row: tuple | None) -> dict[str, Any] | None:
    if row is None:
        return None
    a, b, direction, reason = row
    return {"a": a, "b": b, "direction": direction, "reason": reason}


def _first_divergence(con: Any) -> dict[str, Any] | None:
    for direction in ("forward", "backward"):
        for level in ("error", "warning"):
            row = con.execute(f"""
            select node_a, node_b, direction, reason from nodes
            where direction = '{direction}' and match_method not in ('unmatched', 'ancestor')
              and (out_verdict = '{level}' or param_verdict = '{level}')
              and (coalesce(in_verdict, 'pass') = 'pass'
                   or coalesce(out_err, 0) >= {GROWTH} * coalesce(in_err, 0)
                   or param_verdict = '{level}')
            order by ord, node_a nulls last, node_b nulls last limit 1""").fetchall()
            if row:
                return _finding(row[0])
    return None


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
