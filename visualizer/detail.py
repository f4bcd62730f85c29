"""What the detail panel shows of one node of a diff graph: both sides' statistics, the pair's
compare metrics, its verdict with the reason, where its divergence comes from, and the stacks;
and the API precision check's verdict of the call, or of the flagged calls inside it.

>>> d = detail(DiffGraph.from_dumps("A", "B"), "a", "Module.layers.1.mlp.MLP.forward.0")  # doctest: +SKIP
>>> d.state, d.match_method                                                               # doctest: +SKIP
('error', 'structure')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probe.visualizer import bands as B
from probe.visualizer.check_marks import CheckMarks
from probe.visualizer.diff import DiffGraph
from probe.visualizer.graph import TensorStat


@dataclass
class Detail:
    """What the detail panel shows for a selected node."""

    node_a: str | None
    node_b: str | None
    state: str
    score: float | None
    match_method: str
    reason: str
    impact: str = ""                      # origin | affected | ""
    affected_by: tuple[str, str] | None = None
    tensors_a: list[TensorStat] = field(default_factory=list)
    tensors_b: list[TensorStat] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    stack_a: list[str] = field(default_factory=list)
    stack_b: list[str] = field(default_factory=list)
    nonfinite: bool = False
    #: the API precision check's row of this call when it flagged it (:mod:`probe.visualizer.check_marks`)
    check: dict[str, Any] | None = None
    #: the flagged calls inside this node, worst first: (name, label, verdict, reason)
    check_inside: list[tuple[str, str, str, str]] = field(default_factory=list)


def detail(diff: DiffGraph, side: str, name: str, checks: CheckMarks | None = None) -> Detail:
    """Both sides' statistics, the pair's metrics, verdict with reason, and the stacks; with
    ``checks`` (the side's check marks), the check's verdict of the call or of the calls inside."""
    twin = diff.counterpart(side, name)
    na, nb = (name, twin) if side == "a" else (twin, name)
    p = diff.pair(side, name)
    state = diff.state(side, name)
    impact, source = diff.impact(side, name)
    ga, gb = diff.graphs["a"], diff.graphs["b"]
    check, inside = None, []
    if checks:
        g = diff.graph(side)
        check = checks.row(name)
        inside = [(c, g.nodes[c].label, checks.row(c)["verdict"], checks.row(c).get("reason") or "")
                  for c in checks.inside(g, name)]
    return Detail(
        node_a=na, node_b=nb, state=state, score=diff.score(side, name),
        match_method=p.match_method if p else "",
        reason=p.reason if p else ("no counterpart on the other side" if state == B.UNMATCHED else ""),
        impact=impact, affected_by=source,
        tensors_a=ga.tensors(na) if na and ga is not None else [],
        tensors_b=gb.tensors(nb) if nb and gb is not None else [],
        metrics=diff.metric_rows(na, nb),
        stack_a=ga.stack(na) if na and ga is not None else [],
        stack_b=gb.stack(nb) if nb and gb is not None else [],
        nonfinite=bool((na and ga is not None and ga.nonfinite(na))
                       or (nb and gb is not None and gb.nonfinite(nb))),
        check=check, check_inside=inside)
