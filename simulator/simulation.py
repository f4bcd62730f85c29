"""From traced ranks to the answer: each rank's memory and step time, and a verdict per device.

:func:`simulate` takes what a workload traced (:mod:`probe.simulator.engine_workload`,
:mod:`probe.simulator.script_workload`) and, by level (MindSpore's ``MS_SIMULATION_LEVEL``):

- 0: the operators and the module tree of a training step;
- 1: + each rank's memory timeline from every op's inputs and outputs, its peak and holders;
- 2: + each op's workspace and the device's allocator (rounding, pools, segments, reserve);
- 3: + each op's time on the device, the collectives, the step time, exposed communication, MFU.

Every device of the table (:func:`probe.simulator.devices.all_devices`) gets a verdict (fits or not,
and at level 3 its step time); the chosen ``device`` gets the full figures. The result's
:meth:`Simulation.as_json` is ``simulation.json``.

>>> from probe.simulator.engine_workload import trace_engine
>>> from probe.simulator.layout import make_layout
>>> lay = make_layout(nproc=4, zero=1, global_batch=8)
>>> sim = simulate(trace_engine("tiny", "reference", "float32", lay), lay, level=2, device="H100")
>>> doc = sim.as_json()
>>> doc["params"], doc["ranks"][0]["ranks_like"], doc["verdicts"][0]["fits"]
(131904, [0, 1, 2, 3], True)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from probe.simulator.devices import Device, all_devices, get_device
from probe.simulator.layout import Layout
from probe.simulator.memory import Timeline, timeline
from probe.simulator.ranks import MemoryFigures, memory_figures, step_time, window_start
from probe.simulator.timing import op_seconds
from probe.simulator.trace import PHASES
from probe.simulator.workload import Traced


@dataclass
class Simulation:
    """The figures of one simulation (see the module docstring)."""

    level: int
    layout: Layout
    traced: Traced
    device: Device
    memory: dict[str, list[MemoryFigures]] = field(default_factory=dict)   # device -> per rank trace
    times: dict[str, dict] = field(default_factory=dict)                   # device -> step time
    timelines: dict[int, Timeline] = field(default_factory=dict)
    seconds: dict[int, np.ndarray] = field(default_factory=dict)      # the device's op times
    devices: dict[str, Device] = field(default_factory=dict)          # judged: the table + device

    def worst(self, device: str) -> MemoryFigures:
        """The rank figures with the highest peak on ``device``."""
        return max(self.memory[device], key=lambda f: f.memory["peak"])

    def as_json(self) -> dict:
        """``simulation.json`` (bytes as integers; ranks with equal figures written once)."""
        name = self.device.name
        ranks = []
        for i, rt in enumerate(self.traced.ranks):
            entry = {"rank": rt.ranks[0], "label": rt.label, "holds": rt.holds + _zero_words(self.layout),
                     "memory": self.memory[name][i].memory if self.level >= 1 else None,
                     "step_time_s": self.times[name]["step_time_s"] if self.level >= 3 else None}
            if len(rt.ranks) > 1:
                entry["ranks_like"] = rt.ranks
            ranks.append(entry)
        return {
            "level": self.level,
            "params": self.traced.params,
            "workload": self.traced.describe,
            "device": _describe_device(self.device),
            "layout": self.layout.as_dict(),
            "ranks": ranks,
            "verdicts": [self._verdict(d) for d in self.memory] if self.level >= 1 else [],
            "step": self.times.get(name),
            "peak_holders": self.worst(name).holders if self.level >= 1 else [],
            "operators": _operators(self.traced),
            "modules": _modules(self.traced),
            "notes": self.traced.notes,
        }

    def _verdict(self, device: str) -> dict:
        """Fits when the fullest rank's reserve fits; ``tight`` when only its allocated peak
        does (the allocator frees its cache and retries before it fails); else does not fit."""
        dev = self.devices[device]
        worst = self.worst(device).memory
        reserved = worst.get("reserved", worst["peak"])
        verdict = ("fits" if reserved <= dev.memory_bytes else
                   "tight" if worst["peak"] <= dev.memory_bytes else "does not fit")
        out = {"device": device, "memory_bytes": dev.memory_bytes, "peak_bytes": worst["peak"],
               "reserved_bytes": reserved, "verdict": verdict, "fits": verdict != "does not fit"}
        if device in self.times:
            out["step_time_s"] = self.times[device]["step_time_s"]
            out["mfu"] = self.times[device]["mfu"]
        return out


def simulate(traced: Traced, layout: Layout, *, level: int, device: str | Device,
             measured: dict[int, np.ndarray] | None = None) -> Simulation:
    """The figures of ``traced`` at ``level`` (0-3) with ``device`` (a name or a
    :class:`Device`) chosen (see the module docstring). ``measured``: replayed op times per
    trace (``id(trace)``) for ``device``."""
    primary = device if isinstance(device, Device) else get_device(device)
    sim = Simulation(level, layout, traced, primary, devices={**all_devices(), primary.name: primary})
    if level < 1:
        return sim
    for trace in {id(rt.trace): rt.trace for rt in traced.ranks}.values():
        sim.timelines[id(trace)] = timeline(trace)
    served: dict[tuple, list[MemoryFigures]] = {}
    for name, dev in sim.devices.items():
        key = _allocator_key(dev) if level >= 2 else ()
        if key not in served:
            served[key] = [memory_figures(rt, sim.timelines[id(rt.trace)], layout, dev, min(level, 2))
                           for rt in traced.ranks]
        sim.memory[name] = served[key]
        if level >= 3 and (dev.peak(traced.dtype) or dev.curves):
            seconds = {}
            for rt in traced.ranks:
                known = (measured or {}).get(id(rt.trace)) if name == primary.name else None
                seconds[id(rt.trace)] = op_seconds(rt.trace, dev, known)
            sim.times[name] = step_time(traced.ranks, seconds, layout, dev)
            if name == primary.name:
                sim.seconds = seconds
    return sim


def _zero_words(layout: Layout) -> str:
    """What ZeRO shards of the model states, in words ('' without it)."""
    if layout.zero == 0 or layout.dp == 1:
        return ""
    shards = {1: "optimizer state", 2: "gradients and optimizer state",
              3: "parameters, gradients and optimizer state"}[layout.zero]
    return f"; ZeRO-{layout.zero}: 1/{layout.dp} of the {shards}"


def _allocator_key(device: Device) -> tuple:
    """What level-2 memory depends on: devices equal in it share their figures."""
    return device.caching_allocator, device.kind == "cpu", device.blas_workspace


def _describe_device(device: Device) -> dict:
    return {"name": device.name, "kind": device.kind, "memory_bytes": device.memory_bytes,
            "peak_tflops": {k: v / 1e12 for k, v in device.peak_flops.items()},
            "memory_bw_gbs": device.memory_bw / 1e9, "source": device.source}


def _operators(traced: Traced) -> dict:
    """Ops of the timed step of the first traced rank: how many per phase, the most frequent."""
    rt = traced.ranks[0]
    trace = rt.trace
    names: Counter[str] = Counter()
    flops: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    for name, step, phase, f in zip(trace.op_name, trace.op_step, trace.op_phase, trace.op_flops):
        if step == rt.timed_step:
            names[name] += 1
            flops[name] += f
            phases[PHASES[phase]] += 1
    return {"step": rt.timed_step, "count": sum(names.values()), "by_phase": dict(phases),
            "total_ops_traced": trace.n_ops, "first_forward_op": window_start(trace),
            "top": [{"op": n, "count": c, "flops": flops[n]} for n, c in names.most_common(15)]}


def _modules(traced: Traced) -> list[dict]:
    """The module tree of the first traced rank: name, class, ops and FLOPs of its timed step."""
    rt = traced.ranks[0]
    trace = rt.trace
    ops: Counter[int] = Counter()
    flops: Counter[int] = Counter()
    for module, step, f in zip(trace.op_module, trace.op_step, trace.op_flops):
        if step == rt.timed_step:
            ops[module] += 1
            flops[module] += f
    rows = []
    for index, name in enumerate(trace.modules):
        if name == "Global" and not ops[index]:
            continue
        rows.append({"name": name, "class": trace.module_class.get(name, ""),
                     "depth": name.count("."), "ops": ops[index], "flops": flops[index]})
    return rows
