"""The live page's per-module numerics chart: one module's quantity across steps, per rank.

Choose a module (the modules that have ``numerics:<module>:<quantity>`` points,
:mod:`probe.monitor.numerics_names`; at first the module of the latest anomaly) and a quantity; the
chart draws a line per rank, and the
numerics anomalies (the monitor's ``numerics*`` alerts) of that module as marks on it, their
message on hover. Below, the module's anomalies (all modules' when none is chosen) each say
where they are, and an anomaly the service answered with a targeted dump
(``probe monitor serve --dump-on-alert N``; :mod:`probe.monitor.targeted_dump`) links to the graph
view of that dump; operators' targeted dumps are listed too.

Like the rest of the live page, each refresh sends only the steps not drawn yet
(``extendData``; ``l-num-cursor`` says which); the chart is drawn whole only when the module,
the quantity, the job, the ranks or the anomalies change.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update

from probe.ground.errors import ProbeError
from probe.monitor.numerics_names import QUANTITIES
from probe.web.pages.live_source import LiveSource
from probe.web.security import require

#: The quantity shown first.
DEFAULT_QUANTITY = "grad_norm"
#: Points kept per rank line.
MAX_POINTS = 5000
#: Anomalies listed under the chart.
MAX_LISTED = 30


def section() -> html.Div:
    """The chart's part of the live page."""
    return html.Div([
        html.H4("Per-module numerics"),
        html.Div([
            dcc.Dropdown(id="l-num-module", options=[], value=None, placeholder="module",
                         className="pick"),
            dcc.Dropdown(id="l-num-quantity", value=DEFAULT_QUANTITY, clearable=False,
                         options=[{"label": q, "value": q} for q in QUANTITIES], className="pick"),
        ], className="open-bar"),
        dcc.Graph(id="l-numerics", config={"displayModeBar": False}),
        html.Div(id="l-num-anoms", className="alerts"),
        dcc.Store(id="l-num-cursor"),
    ], id="l-num-section")


def is_numerics_alert(alert: dict[str, Any]) -> bool:
    return str(alert.get("kind", "")).startswith("numerics")


def alert_module(alert: dict[str, Any]) -> str | None:
    """The module a numerics alert names (its ``module``, else its evidence's)."""
    if alert.get("module"):
        return alert["module"]
    ev = alert.get("evidence")
    if isinstance(ev, str):
        try:
            ev = json.loads(ev or "{}")
        except ValueError:
            ev = {}
    return (ev or {}).get("module") if isinstance(ev, dict) else None


def graph_link(dump: dict[str, Any]) -> str:
    """The graph view of one rank's targeted dump, at its first step.

    >>> graph_link({"path": "/r/monitor_dumps/ab12", "steps": "[7, 8]", "rank": 1})
    '/?a=%2Fr%2Fmonitor_dumps%2Fab12&step=7&rank=1'
    """
    steps = json.loads(dump.get("steps") or "[]") if isinstance(dump.get("steps"), str) \
        else list(dump.get("steps") or [])
    params = {"a": dump["path"]}
    if steps:
        params["step"] = steps[0]
    params["rank"] = dump["rank"]
    return "/?" + urlencode(params)


def per_rank(points: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    """rank -> step -> value."""
    out: dict[int, dict[int, float]] = {}
    for p in points:
        if p.get("value") is not None:
            out.setdefault(int(p["rank"]), {})[int(p["step"])] = float(p["value"])
    return out


def figure(module: str | None, quantity: str, data: dict[int, dict[int, float]],
           ranks: list[int], anomalies: list[dict[str, Any]]) -> go.Figure:
    """The chart: a line per rank in ``ranks`` (trace i = rank i, so new points go to it), then
    one trace of anomaly marks."""
    fig = go.Figure()
    fig.update_layout(title=f"{module or 'no module chosen'}: {quantity}", height=300,
                      margin=dict(l=55, r=10, t=40, b=35), template="plotly_white",
                      legend=dict(orientation="h", y=-0.3), uirevision=f"{module}:{quantity}")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title=quantity)
    if not module or not ranks:
        text = ("no per-module numerics yet: train with --numerics (probe train) or add "
                "probe.monitor.agent.numerics_callback.NumericsCallback" if not module else
                f"no {quantity} points for {module} yet")
        fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                           font=dict(size=11, color="#777"))
        return fig
    for rank in ranks:
        per = data.get(rank, {})
        steps = sorted(per)
        fig.add_trace(go.Scatter(x=steps, y=[per[s] for s in steps], name=f"rank {rank}",
                                 mode="lines+markers", marker=dict(size=4)))
    xs, ys, texts = [], [], []
    for a in anomalies:
        step, rank = a.get("step"), a.get("rank")
        value = data.get(rank, {}).get(step) if rank is not None else None
        if value is None:                      # the rank's series lacks that step: on any rank
            value = next((d[step] for d in data.values() if step in d), None)
        if step is None or value is None:
            continue
        xs.append(step)
        ys.append(value)
        texts.append(f"#{a.get('id')} {a.get('kind')} rank {rank}: {a.get('message', '')}")
    fig.add_trace(go.Scatter(x=xs, y=ys, name="anomaly", mode="markers", text=texts,
                             hoverinfo="text", marker=dict(symbol="x", size=12, color="#d62728",
                                                           line=dict(width=2))))
    return fig


def extend(new: dict[int, dict[int, float]], ranks: list[int]) -> Any:
    """``extendData`` of the new points (trace i = ranks[i])."""
    xs = [sorted(new.get(r, {})) for r in ranks]
    if not any(xs):
        return no_update
    return [{"x": xs, "y": [[new[r][s] for s in x] for r, x in zip(ranks, xs)]},
            list(range(len(ranks))), MAX_POINTS]


def anomaly_items(alerts: list[dict[str, Any]], dumps: list[dict[str, Any]],
                  module: str | None) -> list:
    """The numerics anomalies of ``module`` (of every module when None), newest first, each
    with a link to the graph view of the targeted dump it triggered; then the operators'
    targeted dumps."""
    done = [d for d in dumps if d.get("state") == "done" and d.get("path")]
    by_alert: dict[int, list[dict[str, Any]]] = {}
    for d in done:
        if d.get("alert_id") is not None:
            by_alert.setdefault(int(d["alert_id"]), []).append(d)
    pending = {int(d["alert_id"]) for d in dumps
               if d.get("alert_id") is not None and d.get("state") == "pending"}
    shown = [a for a in alerts if is_numerics_alert(a) and (module is None or alert_module(a) == module)]
    out = []
    for a in sorted(shown, key=lambda a: -int(a.get("id") or 0))[:MAX_LISTED]:
        links: list = []
        for d in by_alert.get(int(a.get("id") or 0), []):
            links.append(dcc.Link(f"graph of dump {d['dump_id']} (rank {d['rank']})",
                                  href=graph_link(d), className="dump-link"))
        if not links and int(a.get("id") or 0) in pending:
            links.append(html.Span("targeted dump asked for…", className="when"))
        out.append(html.Div([html.Span(a.get("kind", ""), className=f"kind kind-{a.get('kind')}"),
                             html.Span(alert_module(a) or "", className="where"),
                             html.Span(f"rank {a.get('rank')}", className="where"),
                             html.Span(f"step {a.get('step')}", className="when"),
                             html.Span(a.get("message", ""), className="msg"), *links],
                            className="alert num-anomaly"))
    for d in done:
        if d.get("alert_id") is None and (module is None or d.get("module") in (None, module)):
            out.append(html.Div([html.Span("targeted dump", className="kind"),
                                 html.Span(d.get("scope") or "every module", className="where"),
                                 html.Span(f"rank {d['rank']}", className="where"),
                                 dcc.Link(f"graph of dump {d['dump_id']}", href=graph_link(d),
                                          className="dump-link")],
                                className="alert num-dump"))
    if not out:
        return [html.Div("no numerics anomalies" + (f" for {module}" if module else ""),
                         className="empty")]
    return out


def refresh(source: LiveSource, module: str | None, quantity: str, cursor: dict[str, Any],
            catalog: Any = None) -> tuple:
    """One tick (or a new choice): (module options, module value, figure, extendData, anomaly
    list, cursor). Only steps after the cursor's are read and sent unless the chart is redrawn."""
    job = source.current_job()
    if cursor.get("job") != job:
        cursor = {}
    newest = cursor.get("newest")
    modules = source.numerics_modules(job, newest)
    known = list(dict.fromkeys((cursor.get("modules") or []) + modules))
    alerts = [a for a in source.alerts(job) if is_numerics_alert(a)]
    if module is None and known:              # the module of the latest anomaly, else the first
        latest = [alert_module(a) for a in sorted(alerts, key=lambda a: int(a.get("id") or 0))]
        module = next((m for m in reversed(latest) if m in known), known[0])
    dumps = source.dumps(job)
    if catalog is not None:
        for d in dumps:
            if d.get("state") == "done" and d.get("path"):
                from pathlib import Path

                catalog.add_root(Path(d["path"]).parent, within=source.store_dirs)   # under a given folder: openable
    marks = [a for a in alerts if module is not None and alert_module(a) == module]
    mark_key = [[a.get("id"), a.get("step")] for a in marks]
    same = (cursor.get("module") == module and cursor.get("quantity") == quantity
            and cursor.get("marks") == mark_key)
    last = {int(k): v for k, v in (cursor.get("last") or {}).items()} if same else {}
    since = min(last.values()) + 1 if last else 0
    points = source.numerics(module, quantity, since, job) if module else []
    new = per_rank(p for p in points if p["step"] > last.get(int(p["rank"]), -1))
    merged = dict(last)
    for rank, steps in new.items():
        merged[rank] = max(merged.get(rank, -1), max(steps))
    ranks = sorted(merged)
    options = [{"label": m, "value": m} for m in known]
    if same and ranks == cursor.get("ranks"):
        fig, ext = no_update, extend(new, ranks)
    else:
        data = new if not last else per_rank(source.numerics(module, quantity, 0, job))
        fig, ext = figure(module, quantity, data, ranks, marks), no_update
    steps_seen = [s for s in merged.values()]
    cursor = {"job": job, "module": module, "quantity": quantity, "marks": mark_key,
              "last": {str(r): s for r, s in merged.items()}, "ranks": ranks, "modules": known,
              "newest": max(steps_seen) if steps_seen else newest}
    return options, module, fig, ext, anomaly_items(alerts, dumps, module), cursor


def register(app: Dash, source: LiveSource, catalog: Any = None) -> None:
    """The chart's callback: on each tick of the live page and on a new module or quantity."""

    @app.callback(Output("l-num-module", "options"), Output("l-num-module", "value"),
                  Output("l-numerics", "figure"), Output("l-numerics", "extendData"),
                  Output("l-num-anoms", "children"), Output("l-num-cursor", "data"),
                  Input("l-tick", "n_intervals"), Input("l-num-module", "value"),
                  Input("l-num-quantity", "value"), State("l-num-cursor", "data"))
    def on_tick(_n, module, quantity, cursor):
        if source.token:
            require("reading a token-protected monitor")
        try:
            return refresh(source, module, quantity or DEFAULT_QUANTITY, cursor or {}, catalog)
        except ProbeError as e:
            return (no_update,) * 4 + ([html.Div(f"cannot read numerics: {e}", className="empty")],
                                       no_update)
