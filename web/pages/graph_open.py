"""The graph-diff page's source bar: choose dump A and B, a compare result, the step and the rank.

The choices are the runs and compare results under the folders the dashboard was started on
(:class:`probe.visualizer.catalog.Catalog`); the steps and ranks offered are those both chosen runs
hold. "Open" is handled by the page's main callback (it replaces both views); a bad choice is
answered in ``g-open-msg`` with the catalogue's one-line reason.
"""

from __future__ import annotations

from dash import Dash, Input, Output, dcc, html

from probe.ground.errors import ProbeError
from probe.visualizer.catalog import Catalog, Choice

FIELDS = ("g-open-a", "g-open-b", "g-open-cmp", "g-open-step", "g-open-rank")


def bar(catalog: Catalog, choice: Choice) -> html.Div:
    """The source bar, preset to ``choice``."""
    runs = catalog.runs()
    compares = catalog.compares()

    def options(paths: list[str], current: str | None) -> list[dict]:
        return [{"label": p, "value": p} for p in dict.fromkeys(paths + ([current] if current else []))]

    def value(path: str | None) -> str | None:
        return path if path and _under(catalog, path) else None

    return html.Div([
        dcc.Dropdown(id="g-open-a", options=options(runs, choice.a), value=value(choice.a),
                     placeholder="dump A (a run folder)", className="pick"),
        dcc.Dropdown(id="g-open-b", options=options(runs, choice.b), value=value(choice.b),
                     placeholder="dump B (none: one dump alone)", className="pick"),
        dcc.Dropdown(id="g-open-cmp", options=options(compares, choice.compare), value=value(choice.compare),
                     placeholder="compare result (none: compare now)", className="pick"),
        dcc.Dropdown(id="g-open-step", options=[], value=choice.step, placeholder="step", className="pick-n",
                     clearable=True),
        dcc.Dropdown(id="g-open-rank", options=[], value=choice.rank, placeholder="rank", className="pick-n",
                     clearable=True),
        html.Button("Open", id="g-open", n_clicks=0),
        html.Span(id="g-open-msg", className="error-text"),
    ], className="open-bar", id="g-open-bar")


def _under(catalog: Catalog, path: str) -> bool:
    try:
        catalog.check(path)
    except ProbeError:
        return False
    return True


def choice_of(a: str | None, b: str | None, compare: str | None, step, rank) -> Choice:
    """The choice the bar's fields make."""
    return Choice.from_params({"a": a, "b": b, "compare": compare, "step": step, "rank": rank})


def register(app: Dash, catalog: Catalog) -> None:
    """The steps and ranks offered follow the runs chosen."""

    @app.callback(Output("g-open-step", "options"), Output("g-open-rank", "options"),
                  Input("g-open-a", "value"), Input("g-open-b", "value"))
    def on_runs(a, b):
        steps: set | None = None
        ranks: set | None = None
        for run in (a, b):
            if not run:
                continue
            try:
                s, r = catalog.steps_ranks(run)
            except ProbeError:
                continue
            steps = set(s) if steps is None else steps & set(s)
            ranks = set(r) if ranks is None else ranks & set(r)
        return ([{"label": f"step {s}", "value": s} for s in sorted(steps or ())],
                [{"label": f"rank {r}", "value": r} for r in sorted(ranks or ())])
