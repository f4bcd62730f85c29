"""Graph diff page: the two hierarchy graphs side by side (or one), expanded lazily.

Expanding, collapsing and selecting a node on one side does the same to its counterpart on the
other. A node's fill is its own verdict (the compare's node verdict: pass, warning, error, nan,
unmatched); a second mark says whether its divergence starts there (◆ origin) or comes from an
earlier node (↳ affected by it, a dashed edge). The header gives the compare's labelled counts
(tensors, nodes, unmatched per side). A search box steps through fuzzy hits; a filter list shows
error/warning/unmatched/NaN nodes in execution order; the detail panel shows both sides'
statistics, the compare metrics, the verdict with its reason, and the stacks; "Jump to first
divergence" selects where the numerics first go wrong. A compare result of other dumps is
refused with its reason. All numerics come from :mod:`visualizer`; this module only renders.
"""

from __future__ import annotations

import threading
from typing import Any

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from compare.verdict import format_counts
from visualizer import bands as B
from visualizer.detail import Detail, detail
from visualizer.diff import FILTERS, DiffGraph
from visualizer.navigate import filter_nodes, first_divergence, first_nan, reveal, search

SIDE_TITLE = {"a": "A", "b": "B"}
FILTER_CAP = 500


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def legend() -> html.Div:
    """What the fill says (the node's own verdict) and what the marks say (where it comes from)."""
    fills = [(B.PASS, "pass"), (B.WARNING, "warning"), (B.ERROR, "error"),
             (B.NAN, "nan: NaN/Inf on one side only"), (B.UNMATCHED, "unmatched")]
    marks = [("origin", "◆ origin: its divergence starts here"),
             ("affected", "↳ affected: comes from an earlier node"),
             ("proxy", "hatched: no counterpart of its own, its ancestor's verdict")]
    return html.Div([html.Span("fill = own verdict:", className="legend-head")]
                    + [html.Span(text, className=f"chip band-{b}") for b, text in fills]
                    + [html.Span(text, className=f"chip mark-{m}") for m, text in marks],
                    id="g-legend", className="legend")


def layout(diff: DiffGraph | None) -> html.Div:
    if diff is None:
        return html.Div([html.H2("Graph diff"), html.P(
            "No dump given. Start with: probe web --dump A [B] [--compare DIR]", className="empty")])
    if diff.refusal:
        return html.Div([html.H2("Graph diff: compare result refused"),
                         html.P(diff.refusal, id="g-refusal", className="refusal")], id="page-graph")
    paired = diff.paired
    sides = ("a", "b") if paired else ("a",)
    titles = [html.Div(f"A: {diff.graph('a').title}", className="pane-title")]
    panes = [html.Div([titles[0], html.Div(id="g-tree-a", className="tree")], className="pane")]
    if paired:
        panes.append(html.Div([html.Div(f"B: {diff.graph('b').title}", className="pane-title"),
                               html.Div(id="g-tree-b", className="tree")], className="pane"))
    toolbar = html.Div([
        dcc.Input(id="g-search", type="text", placeholder="search nodes (fuzzy)", debounce=True,
                  className="search"),
        html.Button("◀ prev", id="g-prev", n_clicks=0),
        html.Button("next ▶", id="g-next", n_clicks=0),
        html.Span("", id="g-hit", className="hit"),
        html.Button("Jump to first divergence", id="g-jump", n_clicks=0, className="primary",
                    disabled=not paired),
        html.Button("Jump to first NaN", id="g-jump-nan", n_clicks=0),
        legend(),
    ], className="toolbar")
    side = html.Div([
        html.H4("Filter"),
        dcc.Checklist(id="g-filter", options=[{"label": f" {k}", "value": k}
                                               for k in FILTERS],
                      value=["error", "nan"] if paired else ["nan"], inline=True),
        html.Div(id="g-filter-count", className="count"),
        html.Div(id="g-filter-list", className="filter-list"),
    ], className="sidebar")
    return html.Div([
        html.Div(id="g-summary", className="summary"),
        toolbar,
        html.Div([side, html.Div(panes, className="panes"),
                  html.Div(html.P("Select a node to see its statistics.", className="empty"),
                           id="g-detail", className="detail")], className="graph-body"),
        dcc.Store(id="g-state", data={"exp": {"a": [], "b": []}, "sel": None, "hit": -1}),
        dcc.Store(id="g-click"),
        # the first screen's rows come with the page: no round trip before the first paint
        *[dcc.Store(id=f"g-rows-{s}", data=render_rows(diff, s, set(), None) if s in sides else None)
          for s in ("a", "b")],
        dcc.Store(id="g-flt-items"), dcc.Store(id="g-detail-for"),
        html.Div(id="g-drawn-a", hidden=True), html.Div(id="g-drawn-b", hidden=True),
        html.Div(id="g-drawn-flt", hidden=True),
    ], id="page-graph")


def render_rows(diff: DiffGraph, side: str, expanded: set[str], sel: tuple[str, str] | None) -> list[dict]:
    """The visible rows of one side (the roots and the children of every expanded node), as the
    compact records ``web/assets/tree.js`` draws: node, label, depth, classes (the state's fill
    and the marks), has children, open, the worst state hidden inside a collapsed node, and the
    node an affected one comes from (label, name)."""
    g = diff.graph(side)
    other = "b" if side == "a" else "a"
    selected = None
    if sel:
        selected = sel[1] if sel[0] == side else diff.counterpart(other, sel[1]) if diff.paired else None
    rows = []
    stack = [(n, 0) for n in reversed(g.roots())]
    while stack:
        name, depth = stack.pop()
        open_ = name in expanded
        has_kids = g.has_children(name)
        cls = f"row band-{diff.state(side, name)}"
        impact, source = diff.impact(side, name)
        cls += f" {impact}" if impact else ""
        if diff.proxy(side, name):
            cls += " proxy"
        if name == selected:
            cls += " sel"
        if diff.nonfinite(side, name):
            cls += " nan"
        hint = ""
        if has_kids and not open_ and diff.paired and diff.warmed:
            worst = diff.worst_below(side, name)
            hint = worst if worst in (B.NAN, B.ERROR, B.WARNING) else ""
        row = {"n": name, "l": g.nodes[name].label, "d": depth, "c": cls, "k": int(has_kids),
               "o": int(open_), "h": hint}
        if source:
            row.update(a=diff.graph(source[0]).nodes[source[1]].label, an=source[1])
        rows.append(row)
        if open_:
            stack.extend((k, depth + 1) for k in reversed(g.children(name)))
    return rows


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


def render_detail(diff: DiffGraph, side: str, name: str) -> list:
    d = detail(diff, side, name)
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
            links.append(html.B(" → this → "))
            links += [html.Span(g.nodes[n].label, className="flow-link", title=n, **{
                "data-act": "select", "data-side": label.lower(), "data-node": n}) for n in outs]
            flow.append(html.Div([html.B(f"{label}: "), *links], className="flow"))
    out += [html.H4("Data flow"), *flow, html.H4("Statistics"), _stats_table(d)]
    metrics = _metrics_table(d.metrics)
    if metrics:
        out += [html.H4("Compare metrics"), *metrics]
    for label, stack in (("A", d.stack_a), ("B", d.stack_b)):
        if stack:
            out += [html.H4(f"Stack {label}"), html.Pre("\n".join(stack), className="stack")]
    return out


def register(app: Dash, diff: DiffGraph | None) -> None:
    """Attach the page's callbacks to ``app``."""
    if diff is None or diff.refusal:
        return
    threading.Thread(target=diff.warm, name="probe-web-warm", daemon=True).start()
    sides = ("a", "b") if diff.paired else ("a",)
    tree_outputs = [Output(f"g-rows-{s}", "data") for s in sides]

    @app.callback(
        Output("g-state", "data"), *tree_outputs, Output("g-hit", "children"),
        Input("g-click", "data"),
        Input("g-prev", "n_clicks"), Input("g-next", "n_clicks"), Input("g-search", "value"),
        Input("g-jump", "n_clicks"), Input("g-jump-nan", "n_clicks"),
        State("g-state", "data"),
        prevent_initial_call=True,
    )
    def on_event(click, _prev, _next, query, _jump, _jnan, state):
        state = state or {"exp": {"a": [], "b": []}, "sel": None, "hit": -1}
        exp = {s: list(state["exp"].get(s, [])) for s in ("a", "b")}
        sel = tuple(state["sel"]) if state.get("sel") else None
        hit_text = no_update
        trig = ctx.triggered_id
        target = None
        if trig == "g-click":
            side, name = click.get("side"), click.get("node")
            if side not in sides or name not in diff.graph(side):
                return (no_update,) * (len(sides) + 2)
            if click.get("act") == "toggle":
                twin = diff.counterpart(side, name) if diff.paired else None
                other = "b" if side == "a" else "a"
                if name in exp[side]:
                    exp[side].remove(name)
                    if twin and twin in exp[other]:
                        exp[other].remove(twin)
                else:
                    exp[side].append(name)
                    if twin:
                        exp[other] = list(dict.fromkeys(exp[other] + diff.graph(other).ancestors(twin) + [twin]))
            else:
                target = (side, name)
        elif trig in ("g-prev", "g-next", "g-search"):
            hits = search(diff, query or "")
            if not hits:
                state["hit"] = -1
                hit_text = "no match" if (query or "").strip() else ""
            else:
                i = state.get("hit", -1)
                if trig == "g-search":
                    i = 0
                else:
                    i = (i + (1 if trig == "g-next" else -1)) % len(hits)
                state["hit"] = i
                target = hits[i]
                hit_text = f"{i + 1}/{len(hits)}"
        elif trig == "g-jump":
            target = first_divergence(diff)
            if target is None:
                hit_text = "no divergence found"
        elif trig == "g-jump-nan":
            target = first_nan(diff)
            if target is None:
                hit_text = "no NaN/Inf found"
        if target is not None:
            sel = target
            for s, names in reveal(diff, *target).items():
                exp[s] = list(dict.fromkeys(exp[s] + names))
        state.update(exp=exp, sel=list(sel) if sel else None)
        trees = [render_rows(diff, s, set(exp[s]), sel) for s in sides]
        return (state, *trees, hit_text)

    @app.callback(Output("g-detail", "children"), Output("g-detail-for", "data"),
                  Input("g-state", "data"), State("g-detail-for", "data"))
    def on_detail(state, shown):
        """The detail panel, redrawn only when the selection changes (in parallel with the trees)."""
        sel = (state or {}).get("sel")
        if not sel or sel == shown:
            return no_update, no_update
        return render_detail(diff, *sel), sel

    @app.callback(Output("g-flt-items", "data"), Output("g-filter-count", "children"),
                  Input("g-filter", "value"))
    def on_filter(kinds):
        diff.warm()
        found = filter_nodes(diff, kinds or [])
        items = [{"s": side, "n": name, "l": f"{SIDE_TITLE[side]} · {diff.graph(side).nodes[name].label}",
                  "c": f"flt band-{diff.state(side, name)}"} for side, name in found[:FILTER_CAP]]
        note = f"{len(found)} node(s)" + (f", first {FILTER_CAP} shown" if len(found) > FILTER_CAP else "")
        return items, note

    @app.callback(Output("g-summary", "children"), Input("g-summary", "id"))
    def on_summary(_):
        diff.warm()
        s = diff.summary
        parts = []
        if diff.paired:
            parts.append(format_counts(diff.labelled_counts(), sep=" · "))
            first = first_divergence(diff)
            parts.append(f"first divergence: {first[1] if first else 'none'}")
        first_nan = first_nan(diff)
        parts.append(f"first NaN: {first_nan[1] if first_nan else 'none'}")
        return " · ".join(parts + s.get("notes", []))

    for side in sides:
        app.clientside_callback(
            f"function(rows) {{ return window.probeRenderTree('g-tree-{side}', '{side}', rows); }}",
            Output(f"g-drawn-{side}", "children"), Input(f"g-rows-{side}", "data"))
    app.clientside_callback(
        "function(items) { return window.probeRenderList('g-filter-list', items); }",
        Output("g-drawn-flt", "children"), Input("g-flt-items", "data"))
