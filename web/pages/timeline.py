"""Timeline page: the merged multi-rank trace (mstx ranges, steps, collectives) as a zoomable
Plotly timeline, with a link that opens the same trace file in Perfetto."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html
from flask import request, send_file

from probe.ground.errors import ProbeError
from probe.visualizer.timeline import Span, load_trace_spans, store_spans

TRACE_ROUTE = "/files/trace.json"
PERFETTO = "https://ui.perfetto.dev"
PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d",
           "#bab0ac", "#eeca3b"]


def figure(spans: list[Span]) -> go.Figure:
    """Horizontal bars, one row per rank, thread and category (so nested ranges of different
    domains do not hide each other), one colour per category; zoom with the mouse (drag a box,
    double-click to reset)."""
    fig = go.Figure()
    row = {id(s): f"{s.lane} · {s.cat or 'other'}" for s in spans}
    lanes = sorted(set(row.values()))
    cats: dict[str, list[Span]] = {}
    for s in spans:
        cats.setdefault(s.cat or "other", []).append(s)
    for i, (cat, group) in enumerate(sorted(cats.items())):
        fig.add_trace(go.Bar(
            orientation="h", name=cat, y=[row[id(s)] for s in group], base=[s.start_us / 1e3 for s in group],
            x=[max(s.dur_us / 1e3, 1e-3) for s in group], marker_color=PALETTE[i % len(PALETTE)],
            text=[s.name for s in group], textposition="inside", insidetextanchor="start",
            customdata=[[s.name, s.dur_us / 1e3, cat] for s in group],
            hovertemplate="%{customdata[0]}<br>%{customdata[2]}<br>start %{base:.3f} ms"
                          "<br>%{customdata[1]:.3f} ms<extra></extra>"))
    fig.update_layout(barmode="overlay", height=max(300, 34 * len(lanes) + 120), template="plotly_white",
                      margin=dict(l=230, r=10, t=30, b=40), xaxis_title="time (ms)",
                      legend=dict(orientation="h", y=1.02, yanchor="bottom"), dragmode="zoom")
    fig.update_yaxes(categoryorder="array", categoryarray=lanes[::-1])
    return fig


def _load(trace_file: str | os.PathLike | None, stores: tuple[str, ...]) -> tuple[list[Span], str]:
    if trace_file is not None:
        return load_trace_spans(trace_file), str(trace_file)
    spans: list[Span] = []
    for d in stores:
        try:
            spans += store_spans(d)
        except ProbeError:
            continue
    return spans, ", ".join(stores)


def layout(trace_file: str | os.PathLike | None, stores: tuple[str, ...]) -> html.Div:
    if trace_file is None and not stores:
        return html.Div([html.H2("Timeline"), html.P(
            "No trace given. Start with: probe web --trace OUT/trace.json (or --store RUN_DIR)",
            className="empty")])
    links = []
    if trace_file is not None:
        links = [html.A("Download trace.json", href=TRACE_ROUTE, id="t-download"), " · ",
                 html.A("Open in Perfetto", id="t-perfetto", target="_blank", href=PERFETTO)]
    return html.Div([
        html.H2("Timeline"),
        html.Div(links + [html.Span(id="t-info", className="hint-text")], className="toolbar"),
        dcc.Loading(dcc.Graph(id="t-graph", config={"scrollZoom": True})),
        dcc.Location(id="t-loc"),
    ], id="page-timeline")


def register(app: Dash, trace_file: str | os.PathLike | None, stores: tuple[str, ...]) -> None:
    if trace_file is None and not stores:
        return
    if trace_file is not None:
        path = Path(trace_file).resolve()

        @app.server.route(TRACE_ROUTE)
        def trace_json():
            resp = send_file(path, mimetype="application/json")
            resp.headers["Access-Control-Allow-Origin"] = PERFETTO    # it alone may read it cross-site
            return resp

    @app.callback(Output("t-graph", "figure"), Output("t-info", "children"), Input("t-loc", "pathname"))
    def draw(_path):
        try:
            spans, where = _load(trace_file, stores)
        except ProbeError as e:
            return go.Figure(), str(e)
        return figure(spans), f" {len(spans)} spans from {where}"

    if trace_file is not None:
        @app.callback(Output("t-perfetto", "href"), Input("t-loc", "href"))
        def perfetto_link(href):
            base = (href or request.host_url).split("/timeline")[0].rstrip("/")
            return PERFETTO + "/#!/?url=" + quote(base + TRACE_ROUTE, safe="")
