"""The operator table of a simulation, as event records in the run's store.

Each traced op becomes an ``event`` record (:mod:`probe.collectors.records`) of domain ``simulate``
and kind ``kernel``; each collective one of kind ``comm``. The rank is the first rank the trace
stands for; ``step`` the optimizer steps finished before the op; ``device_start_ns`` and
``device_end_ns`` the op's place on the simulated timeline of the chosen device at level 3
(ops back to back; null below level 3 or where the device has no time for the op's dtype); ``payload`` (JSON) its module, phase, FLOPs, model
FLOPs, bytes moved, seconds, bytes live after it (level 1 and up) and its index in the trace.
So ``probe query OUT "select ... from events where domain = 'simulate'"`` reads it::

    select json_extract_string(payload, '$.module') as module, sum(cast(
           json_extract(payload, '$.flops') as bigint)) as flops
    from events where domain = 'simulate' and kind = 'kernel' group by module order by flops desc

>>> from probe.simulator.engine_workload import trace_engine
>>> from probe.simulator.layout import make_layout
>>> from probe.simulator.simulation import simulate
>>> import tempfile
>>> from probe.collectors.store import open_store
>>> lay = make_layout(nproc=1, global_batch=8)
>>> sim = simulate(trace_engine("tiny", "reference", "float32", lay), lay, level=3, device="A100")
>>> out = tempfile.mkdtemp()
>>> rows = write_op_table(sim, out)
>>> open_store(out).sql("select count(*) from events where domain = 'simulate'").fetchall()[0][0] == rows
True
"""

from __future__ import annotations

import json
import os

import numpy as np

from probe.collectors.records import table_from_columns
from probe.collectors.store import StoreWriter
from probe.simulator.simulation import Simulation
from probe.simulator.trace import PHASES


def write_op_table(sim: Simulation, out: str) -> int:
    """Write one event per traced op and collective under ``out/store``; the rows written."""
    run = os.path.basename(os.path.abspath(out))
    rows = 0
    written: set[int] = set()
    with StoreWriter(out, rank=0, run=run, fsync="never") as store:
        for rt in sim.traced.ranks:
            if id(rt.trace) in written:
                continue
            written.add(id(rt.trace))
            trace = rt.trace
            seconds = sim.seconds.get(id(trace))
            seconds = np.nan_to_num(seconds) if seconds is not None else None
            live = sim.timelines[id(trace)].total if sim.level >= 1 else None
            ends = np.cumsum(seconds * 1e9).astype(np.int64) if seconds is not None else None
            n = trace.n_ops
            payload = [json.dumps({
                "module": trace.modules[trace.op_module[i]], "phase": PHASES[trace.op_phase[i]],
                "flops": trace.op_flops[i], "model_flops": trace.op_model_flops[i],
                "bytes": trace.op_bytes[i], "dtype": trace.op_dtype[i], "index": i,
                "seconds": float(seconds[i]) if seconds is not None else None,
                "live_bytes": int(live[i]) if live is not None else None,
                "label": rt.label}) for i in range(n)]
            columns = {
                "run": [run] * n, "rank": [rt.ranks[0]] * n, "step": list(trace.op_step),
                "domain": ["simulate"] * n, "name": list(trace.op_name), "kind": ["kernel"] * n,
                "device_start_ns": (ends - (seconds * 1e9).astype(np.int64)).tolist() if ends is not None else [None] * n,
                "device_end_ns": ends.tolist() if ends is not None else [None] * n,
                "thread": [0] * n, "payload": payload}
            store.write("event", table_from_columns("event", columns))
            comms = trace.comms
            if comms:
                store.write("event", table_from_columns("event", {
                    "run": [run] * len(comms), "rank": [rt.ranks[0]] * len(comms),
                    "step": [trace.op_step[min(c.op_index, n - 1)] if n else 0 for c in comms],
                    "domain": ["simulate"] * len(comms), "name": [c.op for c in comms],
                    "kind": ["comm"] * len(comms), "thread": [0] * len(comms),
                    "payload": [json.dumps({"group": c.group, "group_size": c.group_size,
                                            "bytes": c.nbytes, "after_op": c.op_index,
                                            "phase": PHASES[c.phase]}) for c in comms]}))
            rows += n + len(comms)
    return rows
