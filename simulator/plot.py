"""The memory timeline of the fullest rank as a Plotly page (``memory_timeline.html``).

Stacked areas: bytes per category after each op (ZeRO shares applied, in-flight microbatches
and ZeRO-3 gathers on top); at level 2 also the allocator's allocated and reserved lines; the
traced steps as bands by phase and the peak marked. Long traces are thinned to at most
``points`` columns, each keeping the op where the total is highest, so no peak is lost.

>>> from probe.simulator.engine_workload import trace_engine
>>> from probe.simulator.layout import make_layout
>>> from probe.simulator.simulation import simulate
>>> import tempfile, os
>>> lay = make_layout(nproc=1, global_batch=8)
>>> sim = simulate(trace_engine("tiny", "reference", "float32", lay), lay, level=2, device="H100")
>>> path = memory_plot(sim, os.path.join(tempfile.mkdtemp(), "m.html"))
>>> open(path).read().count("plotly") > 10
True
"""

from __future__ import annotations

import numpy as np

from probe.simulator.ranks import stack, window_start
from probe.simulator.simulation import Simulation
from probe.simulator.trace import PHASES

COLOURS = {"params": "#4c78a8", "grads": "#f58518", "optimizer": "#54a24b",
           "activations": "#e45756", "temporary": "#b279a2", "in flight / gathered": "#9d755d"}
PHASE_COLOURS = {"forward": "rgba(76,120,168,0.07)", "backward": "rgba(228,87,86,0.07)",
                 "optimizer": "rgba(84,162,75,0.09)"}


def memory_plot(sim: Simulation, path: str, points: int = 4000) -> str:
    """Write the plot of ``sim``'s fullest rank on its device to ``path``; returns ``path``."""
    import plotly.graph_objects as go

    name = sim.device.name
    figures = sim.memory[name]
    index = max(range(len(figures)), key=lambda i: figures[i].memory["peak"])
    rt = sim.traced.ranks[index]
    start = window_start(rt.trace)
    layers = {k: v[start:] for k, v in stack(rt, sim.timelines[id(rt.trace)], sim.layout).items()}
    total = sum(layers.values())
    keep = _thin(total, points)
    x = keep + start
    fig = go.Figure()
    for label, series in layers.items():
        if series.any():
            fig.add_trace(go.Scatter(x=x, y=series[keep] / 2**30, name=label, stackgroup="memory",
                                     mode="lines", line={"width": 0.5, "color": COLOURS[label]}))
    if sim.level >= 2:
        fig.add_trace(go.Scatter(x=x, y=figures[index].series[start:][keep] / 2**30,
                                 name="allocated (allocator)", line={"color": "black", "width": 1}))
    _phase_bands(fig, rt.trace, start)
    peak = figures[index]
    fig.add_trace(go.Scatter(x=[peak.peak_index], y=[peak.memory["peak"] / 2**30], mode="markers+text",
                             name="peak", text=[f"peak {peak.memory['peak'] / 2**30:.2f} GiB"],
                             textposition="top center", marker={"color": "black", "size": 9}))
    fig.update_layout(title=f"{rt.label} (rank {rt.ranks[0]}) on {name}: memory after each op",
                      xaxis_title="op (in trace order)", yaxis_title="GiB", hovermode="x unified",
                      template="plotly_white")
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def _thin(total: np.ndarray, points: int) -> np.ndarray:
    """Column indices: every op, or the highest op of each of ``points`` equal buckets."""
    n = len(total)
    if n <= points:
        return np.arange(n)
    edges = np.linspace(0, n, points + 1).astype(int)
    return np.array([lo + int(total[lo:hi].argmax()) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo])


def _phase_bands(fig, trace, start: int) -> None:
    phases = np.asarray(trace.op_phase[start:])
    if not len(phases):
        return
    cuts = np.flatnonzero(np.diff(phases)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(phases)]):
        colour = PHASE_COLOURS.get(PHASES[phases[lo]])
        if colour and hi - lo > 2:
            fig.add_vrect(x0=lo + start, x1=hi + start, fillcolor=colour, line_width=0, layer="below")
