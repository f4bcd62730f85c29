"""Live cluster page: who is slow, what is wrong, and the charts behind it, while the job runs.

- a banner naming every open alert, most urgent first, each kind with its label and colour from
  :mod:`probe.monitor.alert_kinds`;
- a summary row per rank over the last steps: its own compute time against its peers' median,
  its communication share, its last step and health, the straggler on top and marked (who is a
  straggler is the monitor's detectors' call);
- per-rank charts (step time, own compute time, throughput, MFU, memory, communication share)
  and a rank × step heat map of own compute time (the step time is the same on every rank of a
  synchronous job: it hides the straggler);
- the alerts counted per kind and rank, open ones first, instead of one line per alert;
- a form that asks the monitor for a deep trace of chosen ranks and steps;
- a per-module numerics chart (:mod:`probe.web.pages.live_numerics`): a module's quantity per rank
  across steps, its numerics anomalies marked, each linked to the graph view of the targeted
  dump it triggered.

Each refresh sends only the steps the page has not drawn (``extendData``; the page's cursor
says which), the summary and the alert groups, so its size does not grow with the run. A chart
with nothing to draw says what is missing and how to get it. Data come from
:class:`probe.web.pages.live_source.LiveSource`; the numbers from :mod:`probe.visualizer.cluster`.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update

from probe.ground.errors import ProbeError
from probe.ground.selection import parse_selection
from probe.monitor.alert_kinds import alert_kind, urgency
from probe.visualizer import cluster
from probe.web.pages import live_numerics
from probe.web.pages.live_source import LiveSource
from probe.web.security import NEEDS_TOKEN, authorized, require

#: (chart id, title, metric names tried in order, y-axis title, what to do when none is reported)
CHARTS = [
    ("l-step-time", "Step time per rank", ("step_time_ms",), "step time (ms)",
     "no step_time_ms reported yet: the ranks send it each step once their agent is connected"),
    ("l-compute", "Own compute time per rank (a straggler stands out here)", ("compute_time_ms",), "compute (ms)",
     "no compute_time_ms reported: the bundled engine reports it; a script adds it with "
     "agent.record(step, {'compute_time_ms': ...})"),
    ("l-throughput", "Throughput per rank", ("tokens_per_s",), "tokens/s",
     "no tokens_per_s reported: a script adds it with agent.record(step, {'tokens_per_s': ...})"),
    ("l-mfu", "MFU per rank", ("mfu", "hfu"), "fraction of peak",
     "no MFU: it needs the device's peak FLOP/s. Known GPUs are looked up; elsewhere give it: "
     "probe profile --peak-tflops N (ProfileCallback(peak_tflops=N) in a script)"),
    ("l-memory", "Memory per rank", ("device_mem_mb", "proc_rss_mb"), "memory (MB)",
     "no memory reported: device memory comes from CUDA ranks, process memory from the agent's host sampler"),
    ("l-comm", "Communication share per rank", ("comm_share",), "comm time / step time",
     "no communication share: it needs comm_time_ms and step_time_ms from the ranks"),
]
HEAT = ("compute_time_ms", "no compute_time_ms reported: the heat map shows each rank's own compute time")
#: Points kept per trace in the page.
MAX_POINTS = 5000
#: The most ranks one trace request may name (the rank box is parsed into a list).
MAX_TRACE_RANKS = 65536


def _figure(title: str, ytitle: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=250, margin=dict(l=55, r=10, t=40, b=35),
                      template="plotly_white", legend=dict(orientation="h", y=-0.3), uirevision=title)
    fig.update_yaxes(title=ytitle)
    fig.update_xaxes(title="step")
    return fig


def _missing(fig: go.Figure, text: str) -> go.Figure:
    lines = textwrap.wrap(text, 70, break_on_hyphens=False)
    fig.add_annotation(text="<br>".join(lines), showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(size=11, color="#777"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _metric(data: cluster.Series, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if data.get(n)), None)


def line_chart(data: cluster.Series, ranks: list[int], chart: tuple) -> go.Figure:
    """One chart, a line per rank (every rank in ``ranks``, so that new points go to trace i)."""
    _, title, names, ytitle, missing = chart
    fig = _figure(title, ytitle)
    name = _metric(data, names)
    if name is None:
        return _missing(fig, missing)
    for rank in ranks:
        per = data[name].get(rank, {})
        steps = sorted(per)
        fig.add_trace(go.Scatter(x=steps, y=[per[s] for s in steps], name=f"rank {rank}", mode="lines+markers"))
    fig.update_yaxes(title=f"{ytitle} ({name})" if len(names) > 1 else ytitle)
    return fig


def heat_map(data: cluster.Series, ranks: list[int]) -> tuple[go.Figure, int]:
    """Own compute time, rank × step (columns are the steps every rank has reported); and the
    last step drawn."""
    fig = _figure("Own compute time, rank × step", "rank")
    steps, values = cluster.complete_steps(data, HEAT[0], -1)
    if not data.get(HEAT[0]):
        return _missing(fig, HEAT[1]), -1
    fig.add_trace(go.Heatmap(x=steps, y=[f"rank {r}" for r in ranks], z=values, transpose=True,
                             colorscale="YlOrRd", colorbar=dict(title="ms")))
    return fig, steps[-1] if steps else -1


def _extend(new: cluster.Series, name: str, ranks: list[int]) -> list | Any:
    per = new.get(name, {})
    xs = [sorted(per.get(r, {})) for r in ranks]
    if not any(xs):
        return no_update
    return [{"x": xs, "y": [[per[r][s] for s in x] for r, x in zip(ranks, xs)]}, list(range(len(ranks))),
            MAX_POINTS]


def _num(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def summary_table(rows: list[dict[str, Any]]) -> html.Table | html.P:
    """The per-rank summary (:func:`probe.visualizer.cluster.rank_summary`), the straggler on top."""
    if not rows:
        return html.P("no steps reported yet", className="empty")
    head = html.Tr([html.Th(h) for h in ("rank", "own compute (ms)", "peers' median (ms)", "× peers",
                                          "comm share", "last step", "health")])
    body = []
    for r in rows:
        marks = [html.Span("⚠ straggler", className="chip mark-straggler")] if r["straggler"] else []
        marks += [html.Span("NaN/Inf", className="chip band-nan")] if r["nan"] else []
        body.append(html.Tr([html.Td([f"rank {r['rank']} ", *marks]), html.Td(_num(r["compute_ms"], ".1f")),
                             html.Td(_num(r["peer_ms"], ".1f")), html.Td(_num(r["ratio"], ".2f")),
                             html.Td(_num(r["comm_share"], ".0%")), html.Td(str(r["last_step"])),
                             html.Td(r["health"] or "—")],
                            className="straggler" if r["straggler"] else ("nan" if r["nan"] else "")))
    return html.Table([html.Thead(head), html.Tbody(body)], className="stats ranks-table", id="l-ranks-table")


def banner(alerts: list[dict[str, Any]]) -> list:
    """One line per open alert (:func:`probe.visualizer.cluster.open_alerts`), in the words and
    colour of its kind (:mod:`probe.monitor.alert_kinds`; a kind not in the table by its name)."""
    lines = []
    for a in alerts:
        kind = alert_kind(a["kind"])
        where = f"rank {a['rank']}" if a.get("rank") is not None else "all ranks"
        lines.append(html.Div([html.B(f"⚠ {kind.label if kind else a['kind']}: {where}"),
                               f" since step {a.get('step')} · {a.get('message', '')}"],
                              className=f"banner-line kind-{a['kind']}", title=kind.means if kind else None,
                              style={"color": kind.colour} if kind else None))
    return lines


def alert_items(groups: list[dict[str, Any]]) -> list:
    """The alerts counted per kind and rank (:func:`probe.visualizer.cluster.alert_groups`)."""
    if not groups:
        return [html.Div("no alerts", className="empty")]
    out = []
    for g in groups:
        steps = (f"step {g['first_step']}" if g["first_step"] == g["last_step"]
                 else f"steps {g['first_step']}–{g['last_step']}")
        out.append(html.Div([html.Span(g["kind"], className=f"kind kind-{g['kind']}"),
                             html.Span(f"rank {g['rank']}" if g["rank"] is not None else "all ranks", className="where"),
                             html.Span(f"×{g['count']}", className="count-badge"), html.Span(steps, className="when"),
                             html.Span("open" if g["open"] else "closed", className="state"),
                             html.Span(g["message"], className="msg")],
                            className="alert" + (" open" if g["open"] else "")))
    return out


def layout(source: LiveSource, refresh_ms: int) -> html.Div:
    if not source.available:
        return html.Div([html.H2("Live cluster"), html.P(
            "No job to follow. Start with: probe web --monitor HOST:PORT (or --store RUN_DIR)",
            className="empty")])
    if source.token and not authorized():      # the monitor's data are as private as the monitor
        return html.Div([html.H2("Live cluster"), html.P(
            f"This page shows a monitor that needs a token; it {NEEDS_TOKEN}.", className="empty")])
    form = html.Div([
        html.H4("Deep trace"),
        dcc.Input(id="l-ranks", placeholder="ranks, e.g. 0,1", type="text"),
        dcc.Input(id="l-steps", placeholder="steps, e.g. 5-7", type="text"),
        html.Button("Request trace", id="l-trace", n_clicks=0, className="primary"),
        html.Div(id="l-trace-msg", className="hint-text"),
    ], className="trace-form")
    charts = [dcc.Graph(id=cid, config={"displayModeBar": False}) for cid, *_ in CHARTS]
    return html.Div([
        html.Div(id="l-banner", className="banner"),
        html.Div(id="l-status", className="summary"),
        html.Div([html.Div([html.H4(f"Ranks (last {cluster.OPEN_FOR_STEPS} steps)"), html.Div(id="l-summary"),
                            html.Div(charts + [dcc.Graph(id="l-heat", config={"displayModeBar": False})],
                                     className="charts"),
                            live_numerics.section()]),
                  html.Div([html.H4("Alerts by kind and rank"), html.Div(id="l-alerts", className="alerts"), form],
                           className="side-feed")], className="live-body"),
        dcc.Interval(id="l-tick", interval=refresh_ms, n_intervals=0),
        dcc.Store(id="l-cursor"),
    ], id="page-live")


def register(app: Dash, source: LiveSource, catalog: Any = None) -> None:
    """The page's callbacks; ``catalog`` (the graph page's) is told the folders of targeted
    dumps, so that their links open."""
    if not source.available:
        return
    live_numerics.register(app, source, catalog)
    ids = [cid for cid, *_ in CHARTS]

    @app.callback(*[Output(c, "figure") for c in ids], *[Output(c, "extendData") for c in ids],
                  Output("l-heat", "figure"), Output("l-heat", "extendData"), Output("l-summary", "children"),
                  Output("l-banner", "children"), Output("l-alerts", "children"), Output("l-status", "children"),
                  Output("l-cursor", "data"),
                  Input("l-tick", "n_intervals"), State("l-cursor", "data"),
                  # a tick while a refresh is in flight would supersede it, and under load no
                  # refresh would ever land: the timer pauses until the answer is drawn
                  running=[(Output("l-tick", "disabled"), True, False)])
    def refresh(_n, cursor):
        if source.token:
            require("reading a token-protected monitor")
        try:
            return _refresh(source, cursor or {})
        except ProbeError as e:
            return (*[no_update] * (2 * len(CHARTS) + 6), f"cannot read live data: {e}", no_update)

    @app.callback(Output("l-trace-msg", "children"), Input("l-trace", "n_clicks"),
                  State("l-ranks", "value"), State("l-steps", "value"), prevent_initial_call=True)
    def on_trace(_n, ranks, steps):
        if not authorized():            # an action on the monitor: the dashboard's token, always
            return f"error: requesting a trace {NEEDS_TOKEN}"
        try:
            rank_list = parse_selection(ranks, what="ranks", limit=MAX_TRACE_RANKS) or []
            step_list = parse_selection(steps, what="steps") or []
            if not rank_list or not step_list:
                return "give ranks (e.g. 0,1) and steps (e.g. 5-7)"
            return source.request_trace(rank_list, step_list[0], step_list[-1])
        except (ProbeError, ValueError) as e:
            return f"error: {e}"


def _refresh(source: LiveSource, cursor: dict[str, Any]) -> tuple:
    """One tick: what changed since the page's ``cursor`` (job, ranks, last step per rank, the
    metric each chart draws, the last heat-map column), and the new cursor."""
    job = source.current_job()
    fresh = cursor.get("job") != job
    last = {} if fresh else {int(k): v for k, v in (cursor.get("last") or {}).items()}
    since = min(last.values()) + 1 if last else 0
    points = source.metrics(since_step=since, job=job)
    new = cluster.series(p for p in points if p["step"] > last.get(int(p["rank"]), -1))
    merged = {**last, **cluster.last_steps(new)}
    ranks, newest = sorted(merged), max(merged.values(), default=None)
    drawn = {} if fresh else dict(cursor.get("charts") or {})
    every = fresh or ranks != cursor.get("ranks")
    redraw = {cid for cid, _, names, *_ in CHARTS if every or (not drawn.get(cid) and _metric(new, names))}
    window_from = max(0, (newest or 0) - cluster.OPEN_FOR_STEPS + 1)
    if redraw and since > 0:                 # a chart to draw whole: its history, once
        points = source.metrics(since_step=0, job=job)
    recent = cluster.series(p for p in points if p["step"] >= window_from) if since <= window_from or redraw \
        else cluster.series(source.metrics(since_step=window_from, job=job))
    alerts, health = source.alerts(job), source.health(job)
    data = cluster.series(points) if redraw else new
    figures, extends = [], []
    for chart in CHARTS:
        cid, _, names, *_ = chart
        if cid in redraw:
            figures.append(line_chart(data, ranks, chart))
            extends.append(no_update)
            drawn[cid] = _metric(data, names)
        else:
            figures.append(no_update)
            extends.append(_extend(new, drawn[cid], ranks) if drawn.get(cid) else no_update)
    if every:
        heat, heat_last = heat_map(data, ranks)
        heat_ext = no_update
    else:
        heat = no_update
        steps, values = cluster.complete_steps(recent, HEAT[0], cursor.get("heat", -1))
        heat_ext = [{"x": [steps], "z": [values]}, [0], MAX_POINTS] if steps else no_update
        heat_last = steps[-1] if steps else cursor.get("heat", -1)
    opened = cluster.open_alerts(alerts, newest, urgency())
    where = source.monitor_addr or ", ".join(source.store_dirs)
    status = (f"{where}{f' · job {job}' if job else ''} · ranks: {len(ranks)} · last step: "
              f"{newest if newest is not None else '—'} · alerts: {len(opened)} open, {len(alerts)} in all"
              f" · updated {time.strftime('%H:%M:%S')}")
    cursor = {"job": job, "ranks": ranks, "last": {str(r): s for r, s in merged.items()}, "charts": drawn,
              "heat": heat_last}
    return (*figures, *extends, heat, heat_ext, summary_table(cluster.rank_summary(recent, alerts, health)),
            banner(opened), alert_items(cluster.alert_groups(alerts, newest, urgency())), status, cursor)
