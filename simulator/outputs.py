"""What a simulation leaves in its output folder.

- ``simulation.json``: :meth:`probe.simulator.simulation.Simulation.as_json`;
- ``memory_timeline.html``: the fullest rank's memory over the traced steps (level 1 and up);
- ``store/event/rank*/``: the operator table (:mod:`probe.simulator.optable`), for ``probe query``.

The folder is claimed first (:func:`probe.ground.outdir.claim`): only a previous ``probe simulate``'s
entries are replaced unless ``force``.

>>> from probe.simulator.engine_workload import trace_engine
>>> from probe.simulator.layout import make_layout
>>> from probe.simulator.simulation import simulate
>>> import tempfile
>>> lay = make_layout(nproc=1, global_batch=8)
>>> sim = simulate(trace_engine("tiny", "reference", "float32", lay), lay, level=1, device="H100")
>>> sorted(write_outputs(sim, tempfile.mkdtemp()))
['memory_timeline.html', 'simulation.json', 'store']
"""

from __future__ import annotations

import json
import os

from probe.ground.outdir import claim
from probe.simulator.optable import write_op_table
from probe.simulator.plot import memory_plot
from probe.simulator.simulation import Simulation

ENTRIES = ["simulation.json", "memory_timeline.html", "store"]


def write_outputs(sim: Simulation, out: str, *, force: bool = False) -> dict[str, str]:
    """Write the files of ``sim`` under ``out``; their paths by entry name."""
    root = claim(out, "simulate", ENTRIES, force=force)
    paths = {"simulation.json": str(root / "simulation.json")}
    tmp = paths["simulation.json"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(sim.as_json(), f, indent=1)
    os.replace(tmp, paths["simulation.json"])
    if sim.level >= 1:
        paths["memory_timeline.html"] = memory_plot(sim, str(root / "memory_timeline.html"))
    write_op_table(sim, str(root))
    paths["store"] = str(root / "store")
    return paths
