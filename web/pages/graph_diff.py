"""Graph diff page: each side of the pair as a graph (boxes and data-flow edges) above its tree.

A collapsed module is one box; opening it (double click in the graph, the arrow in the tree, →
or Enter) draws its children inside it, laid out in layers along the data flow
(:mod:`probe.visualizer.layout`). Opening, closing, selecting and panning one side does the same to
its counterpart on the other; a node with no counterpart is dotted. A node's fill is its own
verdict (the compare's node verdict: pass, warning, error, nan, unmatched); the marks say whether
its divergence starts there (◆ origin) or comes from an earlier node (↳ affected), whether it
holds NaN/Inf, and what a closed box hides; with an API precision check result of a dump
(``probe check-api``, given with ``probe web --check DIR`` or found in ``RUN/check/``), the calls
it flagged wear a double outline and a ``✗ <verdict>`` badge, the modules holding them ``✗N``.
"Path to first divergence" and "Path to first NaN" select those nodes, open the way down to
them and light the path from the top and the chain of data flow from the divergence to the NaN. A tap on an edge follows it to its consumer. ↑/↓ walk
the nodes, ←/→ close and open. The selection and the dumps shown are kept in the URL.

The page holds what it shows (``web/assets/view_model.js``): the server sends only what changes
(:meth:`probe.visualizer.view.SideView.delta`), the tree and filter list draw only the rows in view
and the graph only the boxes in view. The source bar opens other dumps, steps and ranks
(:mod:`probe.web.pages.graph_open`); the detail panel (:mod:`probe.web.pages.graph_detail`) shows a node's
statistics, metrics and stacks, and its verdict on every rank. All numerics come from
:mod:`probe.visualizer`; this module only renders.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import parse_qs, urlencode

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from probe.compare.verdict import format_counts
from probe.ground.errors import ProbeError
from probe.ground.text import plural
from probe.visualizer import bands as B
from probe.visualizer.catalog import Catalog, Choice, Opened, run_folder
from probe.visualizer.diff import FILTERS, DiffGraph, other_side
from probe.visualizer.navigate import filter_nodes, first_divergence, first_nan, flow_path, reveal, root_path, search
from probe.web.pages import graph_detail, graph_open
from probe.web.pages.graph_canvas import canvas

SIDE_TITLE = {"a": "A", "b": "B"}
NOTHING = {"add": [], "prune": [], "set": [], "ea": [], "er": []}
CLEARED = dict(NOTHING, reset=True)


def legend() -> html.Div:
    """What the fill says (the node's own verdict) and what the marks say."""
    fills = [(B.PASS, "pass"), (B.WARNING, "warning"), (B.ERROR, "error"),
             (B.NAN, "nan: NaN/Inf on one side only"), (B.UNMATCHED, "unmatched")]
    marks = [("origin", "◆ origin: its divergence starts here"),
             ("affected", "↳ affected: comes from an earlier node"),
             ("proxy", "hatched: no counterpart of its own, its ancestor's verdict"),
             ("nomatch", "dotted: nothing faces it on the other side"),
             ("hint", "● glow: what a closed box hides"),
             ("check", "✗ double outline: a call probe check-api flagged (✗N: N inside)"),
             ("onpath", "blue: path from the top"), ("chain", "orange: data flow divergence → NaN")]
    return html.Div([html.Span("fill = own verdict:", className="legend-head")]
                    + [html.Span(text, className=f"chip band-{b}") for b, text in fills]
                    + [html.Span(text, className=f"chip mark-{m}") for m, text in marks],
                    id="g-legend", className="legend")


class GraphDiffPage:
    """The page for the diff the dashboard was started on, and those opened from it."""

    def __init__(self, diff: DiffGraph | None, dump_a: str | os.PathLike | None = None,
                 dump_b: str | os.PathLike | None = None, compare_dir: str | os.PathLike | None = None,
                 check_dirs: tuple[str | os.PathLike, ...] | list = ()) -> None:
        given = [p for p in (dump_a, dump_b, compare_dir) if p is not None]
        self.catalog = Catalog((run_folder(p).parent for p in given), checks=_checks_given(diff, check_dirs))
        self.first: Opened | None = None
        if diff is not None:
            folder = (lambda p: str(run_folder(p)) if p is not None else None)
            self.first = self.catalog.add(Choice(folder(dump_a), folder(dump_b), folder(compare_dir)), diff)

    # -- layout -----------------------------------------------------------------------------

    def layout(self, search: str | None = None) -> html.Div:
        """The page, with the first view's nodes in it (no round trip before the first paint).

        A dashboard started on no dump opens the one a link names (``?a=RUN&step=N&rank=R``:
        the live page's links to targeted dumps), when the catalogue lets it."""
        opened = self.first
        if opened is None and search:
            query_ = {k: v[-1] for k, v in parse_qs(search.lstrip("?")).items() if k != "sel"}
            try:
                opened = self._open(Choice.from_params(query_)) if query_ else None
            except ProbeError as e:
                return html.Div([html.H2("Graph diff"), html.P(f"cannot open: {e}", className="empty")])
        if opened is None:
            return html.Div([html.H2("Graph diff"), html.P(
                "No dump given. Start with: probe web --dump A [B] [--compare DIR]", className="empty")])
        if opened.diff.refusal:
            return html.Div([html.H2("Graph diff: compare result refused"),
                             html.P(opened.diff.refusal, id="g-refusal", className="refusal")], id="page-graph")
        update = {s: opened.views[s].full(set()) if s in opened.views else CLEARED for s in ("a", "b")}
        update["mark"] = None
        toolbar = html.Div([
            dcc.Input(id="g-search", type="text", placeholder="search nodes (fuzzy)", debounce=True,
                      className="search"),
            html.Button("◀ prev", id="g-prev", n_clicks=0),
            html.Button("next ▶", id="g-next", n_clicks=0),
            html.Span("", id="g-hit", className="hit"),
            html.Button("Path to first divergence", id="g-jump", n_clicks=0, className="primary",
                        disabled=not opened.diff.paired),
            html.Button("Path to first NaN", id="g-jump-nan", n_clicks=0),
            legend(),
        ], className="toolbar")
        side = html.Div([
            html.H4("Filter"),
            dcc.Checklist(id="g-filter", options=[{"label": f" {k}", "value": k} for k in FILTERS],
                          value=["error", "nan"] if opened.diff.paired else ["nan"], inline=True),
            html.Div(id="g-filter-count", className="count"),
            html.Div(id="g-filter-list", className="filter-list"),
            html.P("keys: ↑ ↓ next/previous node · → open · ← close · Enter open/close; "
                   "graph: double click opens, a click on an edge follows it", className="hint-text"),
        ], className="sidebar")
        panes = [html.Div([html.Div(self._title(opened, s), id=f"g-title-{s}", className="pane-title"),
                           canvas(s), html.Div(id=f"g-tree-{s}", className="tree")],
                          className="pane", id=f"g-pane-{s}", style=self._pane_style(opened, s))
                 for s in ("a", "b")]
        return html.Div([
            dcc.Location(id="g-url", refresh=False),
            graph_open.bar(self.catalog, opened.choice),
            html.Div(id="g-summary", className="summary"),
            toolbar,
            html.Div([side, html.Div(panes, className="panes"),
                      html.Div(html.P("Select a node to see its statistics.", className="empty"),
                               id="g-detail", className="detail")], className="graph-body"),
            dcc.Store(id="g-state", data={"view": opened.choice.key, "exp": {"a": [], "b": []}, "sel": None,
                                          "hit": -1}),
            dcc.Store(id="g-view", data=opened.choice.key),
            dcc.Store(id="g-click"), dcc.Store(id="g-update", data=update),
            dcc.Store(id="g-flt-items"), dcc.Store(id="g-detail-for"),
            html.Div(id="g-drawn", hidden=True), html.Div(id="g-drawn-flt", hidden=True),
        ], id="page-graph")

    @staticmethod
    def _title(opened: Opened, side: str) -> str:
        g = opened.diff.graphs[side]
        return f"{SIDE_TITLE[side]}: {g.source or g.title}" if g is not None else ""

    @staticmethod
    def _pane_style(opened: Opened, side: str) -> dict:
        return {} if side in opened.views else {"display": "none"}

    # -- what a request changes ---------------------------------------------------------------

    def _mark(self, opened: Opened, sel: tuple[str, str] | None, focus: bool, chain: bool,
              exp: dict[str, set]) -> dict:
        """The selection, its counterpart, the path from the top on both sides, and (when asked)
        the chain of data flow from the first divergence to the first NaN, lifted to the nodes
        that show with ``exp`` open."""
        diff = opened.diff
        out: dict[str, Any] = {"sel": list(sel) if sel else None, "twin": None, "path": {}, "chain": {},
                               "echain": {}, "focus": focus}
        if sel:
            side, name = sel
            out["path"][side] = root_path(diff, side, name)
            twin = diff.counterpart(side, name) if diff.paired else None
            if twin and twin in (diff.graphs[other_side(side)] or ()):
                out["twin"] = twin
                out["path"][other_side(side)] = root_path(diff, other_side(side), twin)
        if chain:
            out["chain"], out["echain"] = self._chain(opened, exp)
        return out

    @staticmethod
    def _chain(opened: Opened, exp: dict[str, set]) -> tuple[dict, dict]:
        diff = opened.diff
        start, nan = first_divergence(diff), first_nan(diff)
        if not start or not nan:
            return {}, {}
        side, target = nan
        src = start[1] if start[0] == side else diff.counterpart(start[0], start[1])
        if not src or src not in diff.graph(side):
            return {}, {}
        shown = list(dict.fromkeys(opened.views[side].lift(n, exp[side]) for n in flow_path(diff, side, src, target)))
        return {side: shown}, {side: [list(e) for e in zip(shown, shown[1:])]}

    def _url(self, opened: Opened, sel: tuple[str, str] | None) -> str:
        params = opened.choice.params()
        if sel:
            params["sel"] = f"{sel[0]}:{sel[1]}"
        return "?" + urlencode(params) if params else ""

    def _open(self, choice: Choice) -> Opened:
        opened = self.catalog.open(choice)
        if opened.diff.refusal:
            raise ProbeError(opened.diff.refusal)
        return opened

    # -- callbacks ----------------------------------------------------------------------------

    def register(self, app: Dash) -> None:
        """Attach the page's callbacks to ``app``."""
        if self.first is not None and self.first.diff.refusal:
            return
        if self.first is not None:
            _warm(self.first)
        graph_open.register(app, self.catalog)
        catalog = self.catalog

        @app.callback(
            Output("g-state", "data"), Output("g-update", "data"), Output("g-hit", "children"),
            Output("g-url", "search"), Output("g-open-msg", "children"), Output("g-view", "data"),
            Input("g-click", "data"), Input("g-prev", "n_clicks"), Input("g-next", "n_clicks"),
            Input("g-search", "value"), Input("g-jump", "n_clicks"), Input("g-jump-nan", "n_clicks"),
            Input("g-url", "search"), Input("g-open", "n_clicks"),
            State("g-state", "data"), *[State(f, "value") for f in graph_open.FIELDS],
            prevent_initial_call=True,
        )
        def on_event(click, _prev, _next, query, _jump, _jnan, url, _open, state, *fields):
            trig = ctx.triggered_id
            state_view = state["view"]
            opened = catalog.get(state_view) or self.first
            old = {s: set(state["exp"].get(s, [])) for s in ("a", "b")}
            exp = {s: set(v) for s, v in old.items()}
            sel = tuple(state["sel"]) if state.get("sel") else None
            hit, msg, reset = no_update, no_update, False
            target, chain = None, False
            if trig in ("g-open", "g-url"):
                try:
                    if trig == "g-open":
                        choice = graph_open.choice_of(*fields)
                        target_sel = None
                    else:
                        query_ = {k: v[-1] for k, v in parse_qs((url or "").lstrip("?")).items()}
                        target_sel = query_.pop("sel", None)
                        choice = Choice.from_params(query_)
                        if not query_ and not target_sel:
                            return (no_update,) * 6
                    if trig == "g-open" or (choice.params() and choice.key != opened.choice.key):
                        opened = self._open(choice)
                        _warm(opened)
                        exp, sel, old = {"a": set(), "b": set()}, None, {"a": set(), "b": set()}
                        msg = ""
                    # a page opened on a link draws from this answer: the page's own first
                    # view may never have reached its script
                    reset = True
                    if target_sel and ":" in target_sel:
                        side, _, name = target_sel.partition(":")
                        if side in opened.views and name in opened.diff.graph(side):
                            target = (side, name)
                except ProbeError as e:
                    return (no_update,) * 4 + (f"cannot open: {e}", no_update)
            elif trig == "g-click" and click:
                side, name = click.get("side"), click.get("node")
                if side not in opened.views or name not in opened.diff.graph(side):
                    return (no_update,) * 6
                if click.get("act") == "toggle":
                    self._toggle(opened.diff, exp, side, name)
                else:
                    target = (side, name)
            elif trig in ("g-prev", "g-next", "g-search"):
                hits = search(opened.diff, query or "")
                if not hits:
                    state["hit"] = -1
                    hit = "no match" if (query or "").strip() else ""
                else:
                    i = 0 if trig == "g-search" else (state.get("hit", -1) + (1 if trig == "g-next" else -1)) % len(hits)
                    state["hit"] = i
                    target = hits[i]
                    hit = f"{i + 1}/{len(hits)}"
            elif trig in ("g-jump", "g-jump-nan"):
                target = first_divergence(opened.diff) if trig == "g-jump" else first_nan(opened.diff)
                chain = True
                if target is None:
                    hit = "no divergence found" if trig == "g-jump" else "no NaN/Inf found"
            if target is not None:
                sel = target
                for s, names in reveal(opened.diff, *target).items():
                    exp[s] |= set(names)
            update: dict[str, Any] = {}
            for s in ("a", "b"):
                view = opened.views.get(s)
                if view is None:
                    update[s] = CLEARED if reset else NOTHING
                else:
                    update[s] = view.full(exp[s]) if reset else view.delta(old[s], exp[s])
            selected = target is not None or reset
            update["mark"] = self._mark(opened, sel, target is not None, chain, exp) if selected else None
            state.update(view=opened.choice.key, exp={s: sorted(v) for s, v in exp.items()},
                         sel=list(sel) if sel else None)
            url_out = self._url(opened, sel) if selected else no_update
            view_key = opened.choice.key if opened.choice.key != state_view else no_update
            return state, update, hit, url_out, msg, view_key

        @app.callback(Output("g-detail", "children"), Output("g-detail-for", "data"),
                      Input("g-state", "data"), State("g-detail-for", "data"))
        def on_detail(state, shown):
            """The detail panel, redrawn only when the selection changes."""
            sel = (state or {}).get("sel")
            key = [state.get("view"), sel] if sel else None
            if key == shown:
                return no_update, no_update
            opened = catalog.get(state["view"])
            if not sel or opened is None:
                return html.P("Select a node to see its statistics.", className="empty"), key
            both = bool(opened.choice.a and opened.choice.b)
            view = opened.views.get(sel[0])
            return graph_detail.render_detail(opened.diff, *sel, ranks=both,
                                              checks=view.checks if view else None), key

        @app.callback(Output("g-ranks-table", "children"), Input("g-ranks", "n_clicks"),
                      State("g-state", "data"), prevent_initial_call=True)
        def on_ranks(_n, state):
            opened = catalog.get(state["view"])
            if opened is None or not state.get("sel"):
                return no_update
            try:
                return graph_detail.ranks_table(catalog.rank_states(opened, *state["sel"]))
            except ProbeError as e:
                return html.Span(str(e), className="error-text")

        @app.callback(Output("g-flt-items", "data"), Output("g-filter-count", "children"),
                      Input("g-filter", "value"), Input("g-view", "data"))
        def on_filter(kinds, key):
            opened = catalog.get(key)
            if opened is None:
                return [], ""
            diff = opened.diff
            diff.warm()
            found = filter_nodes(diff, kinds or [])
            items = [{"s": s, "n": n, "l": f"{SIDE_TITLE[s]} · {diff.graph(s).nodes[n].label}",
                      "c": f"flt band-{diff.state(s, n)}"} for s, n in found]
            return items, plural(len(found), "node")

        @app.callback(Output("g-summary", "children"), Output("g-title-a", "children"),
                      Output("g-title-b", "children"), Output("g-pane-b", "style"), Output("g-jump", "disabled"),
                      Input("g-view", "data"))
        def on_view(key):
            opened = catalog.get(key)
            if opened is None:
                return "", no_update, no_update, no_update, no_update
            diff = opened.diff
            diff.warm()
            parts = []
            if diff.paired:
                parts.append(format_counts(diff.labelled_counts(), sep=" · "))
                first = first_divergence(diff)
                parts.append(f"first divergence: {first[1] if first else 'none'}")
            nan = first_nan(diff)
            parts.append(f"first NaN: {nan[1] if nan else 'none'}")
            parts += [f"{SIDE_TITLE[s]}: {plural(len(v.checks), 'call')} flagged by the API precision check"
                      for s, v in opened.views.items() if v.checks is not None]
            return (" · ".join(parts + diff.summary.get("notes", [])), self._title(opened, "a"),
                    self._title(opened, "b"), self._pane_style(opened, "b"), not diff.paired)

        app.clientside_callback("function(u) { return window.probe.applyUpdate(u); }",
                                Output("g-drawn", "children"), Input("g-update", "data"))
        app.clientside_callback(
            "function(items) { return window.probeRenderList('g-filter-list', items); }",
            Output("g-drawn-flt", "children"), Input("g-flt-items", "data"))

    @staticmethod
    def _toggle(diff: DiffGraph, exp: dict[str, set], side: str, name: str) -> None:
        """Open or close ``name`` on ``side`` and its counterpart on the other side."""
        other = other_side(side)
        twin = diff.counterpart(side, name) if diff.paired else None
        if twin and twin not in (diff.graphs[other] or ()):
            twin = None
        if name in exp[side]:
            exp[side].discard(name)
            if twin:
                exp[other].discard(twin)
        else:
            exp[side].add(name)
            if twin:
                exp[other] |= set(diff.graph(other).ancestors(twin)) | {twin}


def _checks_given(diff: DiffGraph | None, check_dirs: tuple | list) -> dict:
    """The API precision check results given (``probe web --check``): the first for dump A,
    the second for dump B."""
    if not check_dirs:
        return {}
    if diff is None or diff.refusal:
        raise ProbeError("--check marks a dump's failing calls: give the dump too (--dump A [B])")
    if len(check_dirs) > (2 if diff.paired else 1):
        raise ProbeError(f"{check_dirs[-1]}: one --check per dump (the first for A, the second for B)")
    out = {}
    for side, folder in zip(("a", "b"), check_dirs):
        source = diff.graph(side).source
        if source is not None:
            out[str(run_folder(source))] = str(folder)
    return out


def _warm(opened: Opened) -> None:
    """Compute in the background what the first clicks would wait for: every state, the jump
    targets and the edge index of each side."""
    def work() -> None:
        opened.diff.warm()
        first_divergence(opened.diff)
        first_nan(opened.diff)
        for view in opened.views.values():
            view.prepare()
    threading.Thread(target=work, name="probe-web-warm", daemon=True).start()
