"""Query page: DuckDB SQL over a run's record store, the result as a table and a quick chart.

The SQL comes from whoever holds the page, so it runs in :mod:`probe.collectors.sql_sandbox` (one
SELECT over the run's own views, nothing else, within row, time and memory limits), and the page
and its callback need the dashboard's token (:mod:`probe.web.security`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dash_table, dcc, html

from probe.collectors.sql_sandbox import Limits, run_untrusted
from probe.ground.errors import ProbeError
from probe.web.security import NEEDS_TOKEN, authorized, require

DEFAULT_SQL = "select rank, step, loss, step_time_ms, tokens_per_s from steps order by rank, step"
LIMITS = Limits(max_rows=2000, timeout_s=10.0)


def _cell(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (int, float, str)) or v is None:
        return v
    return str(v)


def quick_chart(cols: list[str], rows: list[tuple]) -> go.Figure:
    """A line per series: x is ``step`` when there is one (else ``time_ns``, else the first
    column), y every other numeric column, one series per ``rank`` when there is one."""
    fig = go.Figure()
    fig.update_layout(margin=dict(l=40, r=10, t=30, b=40), height=320, template="plotly_white")
    if len(cols) < 2 or not rows:
        return fig
    x_i = next((cols.index(c) for c in ("step", "time_ns") if c in cols), 0)
    split = cols.index("rank") if "rank" in cols and cols.index("rank") != x_i else None
    numeric = [i for i in range(len(cols)) if i not in (x_i, split) and all(
        isinstance(r[i], (int, float)) or r[i] is None for r in rows) and any(r[i] is not None for r in rows)]
    groups: dict[Any, list[tuple]] = {}
    for r in rows:
        groups.setdefault(r[split] if split is not None else None, []).append(r)
    for i in numeric[:6]:
        for key, grp in groups.items():
            grp = sorted(grp, key=lambda r: (r[x_i] is None, r[x_i]))
            name = cols[i] if key is None else f"{cols[i]} rank {key}"
            fig.add_trace(go.Scatter(x=[r[x_i] for r in grp], y=[r[i] for r in grp], name=name,
                                     mode="lines+markers"))
    fig.update_xaxes(title=cols[x_i])
    return fig


def layout(store_dirs: tuple[str, ...]) -> html.Div:
    """The page: a store picker, the SQL box, the sandbox's limits, the table and the chart."""
    if not authorized():
        return html.Div([html.H2("Query"), html.P(f"This page {NEEDS_TOKEN}.", className="empty")])
    if not store_dirs:
        return html.Div([html.H2("Query"), html.P(
            "No record store given. Start with: probe web --store RUN_DIR", className="empty")])
    return html.Div([
        html.H2("Query"),
        html.Div([
            dcc.Dropdown(id="q-store", options=[{"label": s, "value": s} for s in store_dirs],
                         value=store_dirs[0], clearable=False, className="store-pick"),
            html.Span("views: tensors, nodes, events, metrics, steps", className="hint-text"),
        ], className="toolbar"),
        dcc.Textarea(id="q-sql", value=DEFAULT_SQL, className="sql"),
        html.P(f"Read-only sandbox: {LIMITS.describe()}.", id="q-limits", className="hint-text"),
        html.Button("Run", id="q-run", n_clicks=0, className="primary"),
        html.Div(id="q-error", className="error-text"),
        html.Div(id="q-count", className="count"),
        dash_table.DataTable(id="q-table", page_size=20, sort_action="native",
                             style_table={"overflowX": "auto"},
                             style_cell={"fontFamily": "monospace", "fontSize": "12px"}),
        dcc.Graph(id="q-chart"),
    ], id="page-query")


def register(app: Dash, store_dirs: tuple[str, ...]) -> None:
    """The Run button's callback: the SQL in the sandbox over the chosen store (token required)."""
    if not store_dirs:
        return

    @app.callback(Output("q-table", "data"), Output("q-table", "columns"), Output("q-chart", "figure"),
                  Output("q-error", "children"), Output("q-count", "children"),
                  Input("q-run", "n_clicks"), State("q-sql", "value"), State("q-store", "value"))
    def on_run(_n, sql, store):
        require("running SQL")
        if store not in store_dirs or not Path(store).exists():
            return [], [], quick_chart([], []), f"{store}: not a store of this dashboard", ""
        try:
            result = run_untrusted(store, sql or "", LIMITS)
        except ProbeError as e:
            return [], [], quick_chart([], []), str(e), ""
        cols, rows = result.columns, result.rows
        data = [{c: _cell(v) for c, v in zip(cols, r)} for r in rows]
        count = f"{len(rows)} row(s)" + (f" (the first {LIMITS.max_rows}: the sandbox's limit)" if result.truncated else "")
        if result.skipped:
            count += f"; {len(result.skipped)} unreadable store segment(s) left out: " + "; ".join(result.skipped)
        return data, [{"name": c, "id": c} for c in cols], quick_chart(cols, rows), "", count
