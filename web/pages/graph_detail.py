"""The detail panel of the graph-diff page: what :mod:`probe.visualizer.detail` says of the selected
node, as tables and links (with the API precision check's verdict of a flagged call, or the list
of flagged calls inside a module), and the node's verdict on every rank side by side
(:meth:`probe.visualizer.catalog.Catalog.rank_states`). It renders only; the numbers come from
:mod:`probe.visualizer`.
"""

from __future__ import annotations

from typing import Any

from dash import html

from probe.ground.text import plural
from probe.visualizer import bands as B
from probe.visualizer.check_marks import CheckMarks
from probe.visualizer.detail import Detail, detail
from probe.visualizer.diff import DiffGraph


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)



def _stats_table(d: Detail) -> html.Table:
    keys = []
    a_by = {t.key: t for t in d.tensors_a}
    b_by = {t.key: t for t in d.tensors_b}
    for t in d.tensors_a + d.tensors_b:
        if t.key not in keys:
            keys.append(t.key)
    head = html.Tr([html.Th(h) for h in ("slot", "index", "dtype", "shape", "side", "max", "min",
                                          "mean", "norm")])
    body = []
    for key in keys:
        for label, t in (("A", a_by.get(key)), ("B", b_by.get(key))):
            if t is None:
                continue
            dtype = (t.dtype or "").removeprefix("torch.").removeprefix("mindspore.")
            cells = [key[0], key[1], dtype, "×".join(map(str, t.shape)) if t.shape else "", label]
            if t.value is not None and t.max is None:
                cells += [t.value, "", "", ""]
            else:
                cells += [_fmt(t.max), _fmt(t.min), _fmt(t.mean), _fmt(t.norm) or (t.md5 or "")]
            body.append(html.Tr([html.Td(c) for c in cells], className="nan" if t.nonfinite else ""))
    return html.Table([html.Thead(head), html.Tbody(body)], className="stats")


#: Compare-row columns shown in the detail panel, in this order, when present.
METRIC_COLUMNS = ("direction", "slot", "index", "max_rel", "min_rel", "mean_rel", "norm_rel", "err", "cosine",
                  "max_abs_err", "max_rel_err", "rmse", "one_thousandth", "hash_match", "verdict")


def _metrics_table(rows: list[dict]) -> list:
    """The compare result's per-tensor rows of the pair (its columns, or a ``metrics`` mapping),
    then each row's reason."""
    if not rows:
        return []
    flat = []
    for r in rows:
        item = dict(r)
        if isinstance(item.get("metrics"), dict):
            item.update(item.pop("metrics"))
        flat.append(item)
    extra = [k for k in flat[0] if k not in METRIC_COLUMNS and isinstance(flat[0][k], float)
             and not k.endswith(("_a", "_b", "_diff"))]
    cols = [c for c in (*METRIC_COLUMNS[:-1], *extra, METRIC_COLUMNS[-1])
            if any(i.get(c) is not None for i in flat)]
    table = html.Table([html.Thead(html.Tr([html.Th(c) for c in cols])),
                        html.Tbody([html.Tr([html.Td(_fmt(i.get(c))) for c in cols]) for i in flat])],
                       className="stats")
    reasons = [html.Li(f"{i.get('slot', '')} {i.get('index', '')}: {i['reason']}") for i in flat if i.get("reason")]
    return [table, html.Ul(reasons, className="reasons")] if reasons else [table]


#: the check row's measures shown in the detail panel, in this order
CHECK_COLUMNS = ("dtype", "shape", "k", "max_ulp", "rel_err", "cosine", "balance", "budget_max", "budget_mean",
                 "over")


def _check_section(d: Detail, side: str) -> list:
    """What the API precision check said of the call (its verdict, reason and measures), or of
    the flagged calls inside the node (each a link that selects it)."""
    if d.check:
        r = d.check
        cols = [c for c in CHECK_COLUMNS if r.get(c) is not None]
        return [html.H4("API precision check"),
                html.Div([html.Span(f"✗ {r['verdict']}", className=f"chip band-{r['verdict']}", id="g-detail-check"),
                          html.Span(f"{r.get('op') or ''} · graded against {r.get('golden') or 'a float64 golden'}")],
                         className="verdict"),
                html.P(r.get("reason") or "", className="reason check-reason"),
                html.Table([html.Thead(html.Tr([html.Th(c) for c in cols])),
                            html.Tbody(html.Tr([html.Td(_fmt(r[c])) for c in cols]))], className="stats")]
    if d.check_inside:
        items = [html.Li([html.Span(f"✗ {verdict}", className=f"chip band-{verdict}"), " ",
                          html.Span(label, className="flow-link", title=n,
                                    **{"data-act": "select", "data-side": side, "data-node": n}),
                          html.Span(f": {reason}", className="check-reason")])
                 for n, label, verdict, reason in d.check_inside]
        return [html.H4(f"API precision check: {plural(len(items), 'flagged call')} inside"),
                html.Ul(items, className="reasons", id="g-detail-check-inside")]
    return []


def render_detail(diff: DiffGraph, side: str, name: str, ranks: bool = False,
                  checks: CheckMarks | None = None) -> list:
    """The detail panel of a node: names, own verdict and marks, where its divergence comes from,
    the API precision check's verdict (``checks``: the side's marks), data flow (each link
    selects the node it names), statistics, compare metrics, stacks; with ``ranks``, a button
    that lays the node's verdict on every rank side by side."""
    d = detail(diff, side, name, checks)
    head = [html.Div([html.B("A: "), d.node_a or "—"]), ]
    if diff.paired:
        head.append(html.Div([html.B("B: "), d.node_b or "—"]))
    verdict = [html.Span(d.state, className=f"chip band-{d.state}", id="g-detail-band",
                         title="the node's own verdict", hidden=d.state == B.NONE)]
    if d.score is not None:
        verdict.append(html.Span(f"precision score {d.score:.3f}"))
    if d.match_method:
        verdict.append(html.Span(f"matched by {d.match_method}"))
    if d.nonfinite:
        verdict.append(html.Span("holds NaN/Inf", className="chip mark-nan"))
    out = [html.Div(head, className="names"), html.Div(verdict, className="verdict")]
    if d.impact == "origin":
        out.append(html.P("◆ origin: its divergence starts here (its inputs agree, or its "
                          "parameters differ, or its error grows here)", className="impact"))
    elif d.affected_by:
        s, n = d.affected_by
        out.append(html.P(["↳ affected by ", html.Span(
            diff.graph(s).nodes[n].label, className="flow-link", title=n,
            **{"data-act": "select", "data-side": s, "data-node": n}),
            ": its inputs already differ, the divergence comes from there"], className="impact"))
    if d.reason:
        out.append(html.P(d.reason, className="reason"))
    flow = []
    for label, node_name in (("A", d.node_a), ("B", d.node_b)):
        if node_name and diff.graphs[label.lower()] is not None:
            g = diff.graph(label.lower())
            ins, outs = g.neighbours(node_name)
            links = [html.Span(g.nodes[n].label, className="flow-link", title=n, **{
                "data-act": "select", "data-side": label.lower(), "data-node": n}) for n in ins]
            links.append(html.B(" → this → ", className="flow-this"))
            links += [html.Span(g.nodes[n].label, className="flow-link", title=n, **{
                "data-act": "select", "data-side": label.lower(), "data-node": n, "data-flow": "out"})
                for n in outs]
            flow.append(html.Div([html.B(f"{label}: "), *links], className="flow"))
    if ranks and diff.paired:
        out += [html.Button("Verdict on every rank", id="g-ranks", n_clicks=0),
                html.Div(id="g-ranks-table", className="ranks")]
    out += _check_section(d, side)
    out += [html.H4("Data flow (fed by → this → feeds)"), *flow, html.H4("Statistics"), _stats_table(d)]
    metrics = _metrics_table(d.metrics)
    if metrics:
        out += [html.H4("Compare metrics"), *metrics]
    for label, stack in (("A", d.stack_a), ("B", d.stack_b)):
        if stack:
            out += [html.H4(f"Stack {label}"), html.Pre("\n".join(stack), className="stack")]
    return out


def ranks_table(rows: list[dict[str, Any]]) -> html.Table:
    """The node's verdict on each rank (:meth:`probe.visualizer.catalog.Catalog.rank_states`), the
    rank shown now marked."""
    head = html.Tr([html.Th(h) for h in ("rank", "own verdict", "divergence", "NaN/Inf")])
    body = [html.Tr([html.Td(f"{r['rank']}{' (shown)' if r['shown'] else ''}"),
                     html.Td(html.Span(r["state"], className=f"chip band-{r['state']}")),
                     html.Td({"origin": "◆ starts here", "affected": "↳ comes from upstream"}.get(r["impact"], "")),
                     html.Td("yes" if r["nan"] else "")], className="shown" if r["shown"] else "")
            for r in rows]
    return html.Table([html.Thead(head), html.Tbody(body)], className="stats ranks", id="g-ranks-rows")
