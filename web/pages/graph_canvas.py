"""The graph view of one side: a dash-cytoscape canvas, its stylesheet and its minimap.

Edges are drawn over the open boxes and under the closed ones (so a click on a box is the box's).
The canvas starts empty: ``web/assets/graph.js`` hands it the boxes in view from the page's client
model (``web/assets/view_model.js``), laid out by :mod:`probe.visualizer.layout`, so no cytoscape layout
runs in the page (``preset``). A box's fill is the node's own verdict
(:data:`probe.visualizer.bands.COLOURS`, the colours of the tree and the legend); its outline says the
rest: origin (thick), affected (dashed), NaN/Inf (purple), no counterpart (dotted, faded), a call
the API precision check flagged (double, red for error, amber for warning; its label starts with
``✗ <verdict>``) and a node holding such calls (red, label ``✗N``), the
selection (blue), the path from the top (blue glow) and the chain of data flow between the first
divergence and the first NaN (orange glow).
"""

from __future__ import annotations

import json

import dash_cytoscape as cyto
from dash import html

from probe.visualizer import bands as B


def stylesheet() -> list[dict]:
    """The cytoscape stylesheet of the graph view."""
    base = [
        {"selector": "node", "style": {
            "shape": "round-rectangle", "width": "data(w)", "height": "data(h)", "label": "data(label)",
            "font-size": 11, "text-valign": "center", "text-halign": "center", "text-wrap": "ellipsis",
            "text-max-width": "data(w)", "min-zoomed-font-size": 6, "background-color": B.COLOURS[B.NONE],
            "border-width": 1, "border-color": "#8a939c", "z-index": "data(z)", "z-index-compare": "manual"}},
        {"selector": "node.box", "style": {
            "text-valign": "top", "text-margin-y": 17, "font-weight": "bold", "background-opacity": 0.12,
            "border-style": "dashed"}},
        {"selector": "node.folded", "style": {"background-opacity": 0.7, "border-width": 2}},
        {"selector": "edge", "style": {
            "width": 1.4, "line-color": "#9aa5b1", "target-arrow-color": "#9aa5b1",
            "target-arrow-shape": "triangle", "arrow-scale": 0.8, "curve-style": "bezier", "z-index": 50,
            "z-index-compare": "manual"}},
    ]
    fills = [{"selector": f"node.band-{state}", "style": {"background-color": colour}}
             for state, colour in B.COLOURS.items() if state != B.NONE]
    fills.append({"selector": "node.band-error, node.band-nan", "style": {"color": "#fff"}})
    fills.append({"selector": "node.box.band-error, node.box.band-nan", "style": {"color": "#222"}})
    marks = [
        {"selector": "node.origin", "style": {"border-width": 4, "border-color": "#111"}},
        {"selector": "node.affected", "style": {"border-style": "dashed", "border-width": 2}},
        {"selector": "node.nan", "style": {"border-color": B.COLOURS[B.NAN], "border-width": 3}},
        {"selector": "node.nomatch", "style": {"border-style": "dotted", "border-width": 2, "opacity": 0.75}},
        {"selector": "node.hint-error", "style": {"underlay-color": B.COLOURS[B.ERROR], "underlay-opacity": 0.35,
                                                  "underlay-padding": 4}},
        {"selector": "node.hint-nan", "style": {"underlay-color": B.COLOURS[B.NAN], "underlay-opacity": 0.35,
                                                "underlay-padding": 4}},
        {"selector": "node.hint-warning", "style": {"underlay-color": B.COLOURS[B.WARNING],
                                                    "underlay-opacity": 0.45, "underlay-padding": 4}},
        {"selector": "node.chain", "style": {"underlay-color": "#f97316", "underlay-opacity": 0.5,
                                             "underlay-padding": 7}},
        {"selector": "node.onpath", "style": {"underlay-color": "#2563eb", "underlay-opacity": 0.3,
                                              "underlay-padding": 6}},
        {"selector": "node.box.onpath, node.box.chain", "style": {"underlay-opacity": 0, "border-color": "#2563eb",
                                                                  "border-width": 2}},
        {"selector": "node.check-in", "style": {"border-color": B.COLOURS[B.ERROR], "border-width": 2}},
        {"selector": "node.check-warning", "style": {"border-color": "#e09f00", "border-width": 4,
                                                     "border-style": "double"}},
        {"selector": "node.check-error", "style": {"border-color": "#c1121f", "border-width": 5,
                                                   "border-style": "double"}},
        {"selector": "node.check-nan", "style": {"border-color": B.COLOURS[B.NAN], "border-width": 5,
                                                 "border-style": "double"}},
        {"selector": "node.sel", "style": {"border-color": "#2563eb", "border-width": 4, "border-style": "solid"}},
        {"selector": "edge.chain", "style": {"line-color": "#f97316", "target-arrow-color": "#f97316", "width": 3}},
        {"selector": "edge.followed", "style": {"line-color": "#2563eb", "target-arrow-color": "#2563eb",
                                                "width": 3}},
    ]
    return base + fills + marks


def canvas(side: str) -> html.Div:
    """The graph view of ``side`` with its minimap (drawn by ``web/assets/graph.js``)."""
    return html.Div([
        cyto.Cytoscape(id=f"g-graph-{side}", elements=[], layout={"name": "preset", "fit": False},
                       autoRefreshLayout=False, autoungrabify=True, autounselectify=True,
                       boxSelectionEnabled=False, minZoom=0.02, maxZoom=3.0,
                       stylesheet=stylesheet(), style={"width": "100%", "height": "100%"}),
        html.Canvas(id=f"g-mini-{side}", width=150, height=110, className="minimap",
                    title="overview: the whole graph, the box is what is in view; click to go there",
                    **{"data-colours": json.dumps(B.COLOURS)}),
    ], className="graph-box")
