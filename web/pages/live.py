"""Live cluster page: per-rank step time, compute time, throughput, MFU, memory and communication share as
Plotly charts refreshed while the job runs, a rank × step heat map, the alert feed, and a form
that asks the monitor service for a deep trace of chosen ranks and steps.

Data come from the monitor service (``monitor.client``) when ``--monitor`` is given, else from
the record stores of the given run directories (``collectors.store``), re-read on each refresh.
"""

from __future__ import annotations

import time
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update

from ground.errors import ProbeError
from ground.selection import parse_selection
from visualizer.diff import records

#: (chart id, title, metric names tried in order, y-axis title)
CHARTS = [
    ("l-step-time", "Step time per rank", ("step_time_ms",), "ms"),
    ("l-compute", "Compute time per rank (a straggler stands out here)", ("compute_time_ms",), "ms"),
    ("l-throughput", "Throughput per rank", ("tokens_per_s",), "tokens/s"),
    ("l-mfu", "MFU per rank", ("mfu", "hfu"), "fraction of peak"),
    ("l-memory", "Memory per rank", ("device_mem_mb", "proc_rss_mb"), "MB"),
    ("l-comm", "Communication share per rank", ("comm_share",), "comm time / step time"),
]

#: Every metric the page draws (the communication share is derived from two of them).
METRIC_NAMES = tuple(dict.fromkeys(n for _, _, names, _ in CHARTS for n in names if n != "comm_share")) + (
    "comm_time_ms",)


class LiveSource:
    """Where the live page reads metrics and alerts, and sends trace requests."""

    def __init__(self, monitor_addr: str | None = None, store_dirs: tuple[str, ...] = (),
                 job: str | None = None, token: str | None = None) -> None:
        self.monitor_addr = monitor_addr
        self.store_dirs = tuple(store_dirs)
        self.job = job
        self.token = token
        self._client: Any = None

    @property
    def available(self) -> bool:
        return bool(self.monitor_addr or self.store_dirs)

    def client(self) -> Any:
        if self._client is None:
            from monitor.client import MonitorClient

            self._client = MonitorClient(self.monitor_addr, token=self.token)
        return self._client

    def current_job(self) -> str | None:
        """The ``job`` given, else the job the monitor heard from most recently."""
        if self.job or not self.monitor_addr:
            return self.job
        jobs = self.client().status().get("jobs") or []

        def age(j: dict) -> float:
            seen = [r["last_seen_s"] for r in j.get("ranks", []) if r.get("last_seen_s") is not None]
            return min(seen) if seen else float("inf")
        return min(jobs, key=age)["job"] if jobs else None

    def metrics(self) -> list[dict[str, Any]]:
        """The charted metric points (job, rank, step, name, value) of the followed job."""
        if self.monitor_addr:
            job = self.current_job()
            return records(self.client().metrics(job=job, names=METRIC_NAMES)) if job else []
        from collectors.store import open_store

        out = []
        names = ", ".join(f"'{n}'" for n in METRIC_NAMES)
        for d in self.store_dirs:
            try:
                con = open_store(d)
            except ProbeError:
                continue            # the run has not written its first segment yet
            try:
                sql = f"select job, rank, step, name, value from metrics where name in ({names})"
                if self.job:
                    rows = con.execute(sql + " and job = ?", [self.job]).fetchall()
                else:
                    rows = con.execute(sql).fetchall()
            finally:
                con.close()
            out += [{"job": j, "rank": r, "step": s, "name": n, "value": v} for j, r, s, n, v in rows]
        return out

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts raised by the monitor's detectors (newest last); none without a monitor."""
        if not self.monitor_addr:
            return []
        job = self.current_job()
        return records(self.client().alerts(job=job)) if job else []

    def status(self) -> dict[str, Any] | None:
        return self.client().status() if self.monitor_addr else None

    def request_trace(self, ranks: list[int], first: int, last: int) -> str:
        """Ask the monitor for a deep trace of steps ``first``..``last`` on ``ranks``."""
        if not self.monitor_addr:
            raise ProbeError("deep traces need the monitor service: start with probe web --monitor HOST:PORT")
        job = self.current_job()
        if not job:
            raise ProbeError(f"{self.monitor_addr}: the monitor knows no job yet")
        reply = self.client().request_trace(job, ranks, (first, last))
        missing = f", not connected: {reply['missing']}" if reply.get("missing") else ""
        return (f"trace {reply.get('trace_id', '')} requested: job {job}, ranks {reply.get('ranks', ranks)}, "
                f"steps {first}-{last}{missing}")


def series(points: list[dict[str, Any]]) -> dict[str, dict[int, dict[int, float]]]:
    """Points regrouped as name -> rank -> step -> value (the last value wins)."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for p in points:
        if p.get("value") is None or p.get("step") is None:
            continue
        out.setdefault(p["name"], {}).setdefault(int(p["rank"]), {})[int(p["step"])] = float(p["value"])
    comm, step = out.get("comm_time_ms"), out.get("step_time_ms")
    if comm and step and "comm_share" not in out:
        out["comm_share"] = {r: {s: comm[r][s] / step[r][s] for s in comm[r]
                                 if s in step.get(r, {}) and step[r][s]} for r in comm}
    return out


def _figure(title: str, ytitle: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=260, margin=dict(l=50, r=10, t=40, b=35),
                      template="plotly_white", legend=dict(orientation="h", y=-0.25),
                      uirevision=title)
    fig.update_yaxes(title=ytitle)
    fig.update_xaxes(title="step")
    return fig


def line_chart(data: dict[str, dict[int, dict[int, float]]], title: str, names: tuple[str, ...],
               ytitle: str) -> go.Figure:
    fig = _figure(title, ytitle)
    name = next((n for n in names if n in data), None)
    if name is None:
        fig.add_annotation(text=f"no {names[0]} reported", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5)
        return fig
    for rank in sorted(data[name]):
        steps = sorted(data[name][rank])
        fig.add_trace(go.Scatter(x=steps, y=[data[name][rank][s] for s in steps], name=f"rank {rank}",
                                 mode="lines+markers"))
    return fig


def heat_map(data: dict[str, dict[int, dict[int, float]]]) -> go.Figure:
    fig = _figure("Step time, rank × step", "rank")
    per = data.get("step_time_ms", {})
    if not per:
        return fig
    ranks = sorted(per)
    steps = sorted({s for r in ranks for s in per[r]})
    z = [[per[r].get(s) for s in steps] for r in ranks]
    fig.add_trace(go.Heatmap(x=steps, y=[f"rank {r}" for r in ranks], z=z, colorscale="YlOrRd",
                             colorbar=dict(title="ms")))
    return fig


def alert_items(alerts: list[dict[str, Any]]) -> list:
    if not alerts:
        return [html.Div("no alerts", className="empty")]
    items = []
    for a in reversed(alerts[-100:]):
        when = time.strftime("%H:%M:%S", time.localtime((a.get("time_ns") or 0) / 1e9))
        where = " ".join(x for x in (f"rank {a['rank']}" if a.get("rank") is not None else "",
                                     f"step {a['step']}" if a.get("step") is not None else "") if x)
        items.append(html.Div([html.Span(when, className="when"),
                               html.Span(a.get("kind", ""), className=f"kind kind-{a.get('kind', '')}"),
                               html.Span(where, className="where"),
                               html.Span(a.get("message", ""), className="msg")], className="alert"))
    return items


def layout(source: LiveSource, refresh_ms: int) -> html.Div:
    if not source.available:
        return html.Div([html.H2("Live cluster"), html.P(
            "No job to follow. Start with: probe web --monitor HOST:PORT (or --store RUN_DIR)",
            className="empty")])
    form = html.Div([
        html.H4("Deep trace"),
        dcc.Input(id="l-ranks", placeholder="ranks, e.g. 0,1", type="text"),
        dcc.Input(id="l-steps", placeholder="steps, e.g. 5-7", type="text"),
        html.Button("Request trace", id="l-trace", n_clicks=0, className="primary"),
        html.Div(id="l-trace-msg", className="hint-text"),
    ], className="trace-form")
    charts = [dcc.Graph(id=cid, config={"displayModeBar": False}) for cid, *_ in CHARTS]
    return html.Div([
        html.Div(id="l-status", className="summary"),
        html.Div([html.Div(charts + [dcc.Graph(id="l-heat", config={"displayModeBar": False})],
                           className="charts"),
                  html.Div([html.H4("Alerts"), html.Div(id="l-alerts", className="alerts"), form],
                           className="side-feed")], className="live-body"),
        dcc.Interval(id="l-tick", interval=refresh_ms, n_intervals=0),
    ], id="page-live")


def register(app: Dash, source: LiveSource) -> None:
    if not source.available:
        return

    @app.callback(*[Output(cid, "figure") for cid, *_ in CHARTS], Output("l-heat", "figure"),
                  Output("l-alerts", "children"), Output("l-status", "children"),
                  Input("l-tick", "n_intervals"),
                  # a tick while a refresh is in flight would supersede it, and under load no
                  # refresh would ever land: the timer pauses until the answer is drawn
                  running=[(Output("l-tick", "disabled"), True, False)])
    def refresh(_n):
        try:
            data = series(source.metrics())
            alerts = source.alerts()
            job = source.current_job()
        except ProbeError as e:
            return (*[no_update] * (len(CHARTS) + 2), f"cannot read live data: {e}")
        figs = [line_chart(data, title, names, y) for _, title, names, y in CHARTS]
        ranks = sorted({r for per in data.values() for r in per})
        last = max((s for per in data.get("step_time_ms", {}).values() for s in per), default=None)
        where = source.monitor_addr or ", ".join(source.store_dirs)
        status = (f"{where}{f' · job {job}' if job else ''} · ranks: {len(ranks)} · last step: {last if last is not None else '—'}"
                  f" · alerts: {len(alerts)} · updated {time.strftime('%H:%M:%S')}")
        return (*figs, heat_map(data), alert_items(alerts), status)

    @app.callback(Output("l-trace-msg", "children"), Input("l-trace", "n_clicks"),
                  State("l-ranks", "value"), State("l-steps", "value"), prevent_initial_call=True)
    def on_trace(_n, ranks, steps):
        try:
            rank_list = parse_selection(ranks, what="ranks") or []
            step_list = parse_selection(steps, what="steps") or []
            if not rank_list or not step_list:
                return "give ranks (e.g. 0,1) and steps (e.g. 5-7)"
            return source.request_trace(rank_list, step_list[0], step_list[-1])
        except (ProbeError, ValueError) as e:
            return f"error: {e}"
