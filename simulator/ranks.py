"""Each rank's memory and the job's step time, from the traced ranks, the layout and a device.

Memory of a rank (levels 1 and 2), over the training steps (from the first forward op on):

1. the traced rank's live bytes per category, each category times its ZeRO share over the
   data-parallel group (stage 1: optimizer state ``/ dp``; 2: also gradients; 3: also
   parameters);
2. plus, inside each traced microbatch's forward-to-backward window, the activations of the
   ``in_flight - 1`` other microbatches a 1F1B pipeline stage holds then;
3. plus, with ZeRO-3, two layers' gathered parameters during forward and backward (the one
   computing and the one prefetched, as FSDP allows);
4. level 2: the storages go through the device's allocator (:mod:`probe.simulator.allocator`) with
   their workspaces instead of being summed; peak *allocated* and *reserved* are reported.

Step time (level 3): ``sum_s fb_s + (m - 1) * max_s fb_s + max_s (other_s + optimizer_s +
exposed sync_s)`` where ``fb_s`` is stage ``s``'s forward and backward of one microbatch with
its tensor- and pipeline-parallel communication (on the critical path), ``m`` the microbatches
per step (one stage: ``m * fb``, gradient accumulation). The data-parallel gradient sync is
computed from the gradient bytes and the ZeRO stage (all-reduce; reduce-scatter + all-gather
of the parameter shards; ZeRO-3 gathers twice more): the bundled engine runs it after backward
(all exposed), a script's DDP overlaps it with backward. MFU is the model FLOPs of a step over
the step time and the device's dense peak for the dtype most FLOPs ran in.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from probe.simulator.allocator import serve
from probe.simulator.collectives import comm_seconds, group_crosses_nodes
from probe.simulator.devices import Device
from probe.simulator.layout import Layout
from probe.simulator.memory import Timeline, holders, storage_arrays
from probe.simulator.timing import phase_seconds, step_flops
from probe.simulator.trace import BACKWARD, CATEGORIES, FORWARD, Trace
from probe.simulator.workload import RankTrace


@dataclass
class MemoryFigures:
    """One rank's memory on one device (bytes)."""

    memory: dict[str, int]
    series: np.ndarray          # bytes after each op (level 2: allocated), zero before the window
    peak_index: int
    holders: list[dict]


def zero_factors(layout: Layout) -> dict[str, float]:
    """The share of each category a rank keeps under ``layout.zero`` (see the module docstring).

    >>> from probe.simulator.layout import make_layout
    >>> zero_factors(make_layout(nproc=4, zero=2, global_batch=4))
    {'params': 1.0, 'grads': 0.25, 'optimizer': 0.25, 'activations': 1.0, 'temporary': 1.0}
    """
    share = 1.0 / layout.dp
    shard = {1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
    sharded = shard.get(layout.zero, ())
    return {name: share if name in sharded else 1.0 for name in CATEGORIES}


def window_start(trace: Trace) -> int:
    """The first forward op: memory before it is the program's set-up, not its training."""
    phases = np.asarray(trace.op_phase)
    hits = np.flatnonzero(phases == FORWARD)
    return int(hits[0]) if len(hits) else 0


def memory_figures(rt: RankTrace, tl: Timeline, layout: Layout, device: Device, level: int) -> MemoryFigures:
    """One rank's memory on ``device`` at ``level`` (1 or 2); see the module docstring."""
    trace = rt.trace
    factors = zero_factors(layout)
    in_flight = _in_flight(rt, tl)
    extra = in_flight + _zero3_gathers(trace, layout)
    start = window_start(trace)
    maxima = {name: int((tl.live[i, start:] * factors[name]).max()) if trace.n_ops > start else 0
              for i, name in enumerate(CATEGORIES)}
    maxima["activations"] += int(in_flight.max()) if trace.n_ops else 0
    if level >= 2:
        served = serve(trace, caching=device.caching_allocator, cuda_rules=device.kind != "cpu",
                       blas_workspace=device.blas_workspace, factors=factors, start=start)
        series, reserved = served.allocated + extra, served.reserved + extra
    else:
        series, reserved = tl.scaled(factors, extra), None
    series = series.copy()
    series[:start] = 0
    peak_index = int(series.argmax()) if len(series) else 0
    memory = {**maxima, "peak": int(series[peak_index]) if len(series) else 0}
    if reserved is not None:
        memory["reserved"] = int(reserved[start:].max()) if len(reserved) > start else 0
    rows = [{**row, "bytes": int(row["bytes"] * factors[row["category"]])}
            for row in holders(trace, peak_index, top=12)]
    if len(extra) and extra[peak_index] > 0:
        rows.append({"module": "(other microbatches in flight, ZeRO-3 gathers)",
                     "category": "activations", "bytes": int(extra[peak_index])})
    rows.sort(key=lambda r: -r["bytes"])
    return MemoryFigures(memory, series, peak_index, rows[:10])


def stack(rt: RankTrace, tl: Timeline, layout: Layout) -> dict[str, np.ndarray]:
    """Bytes per category after each op of one rank (ZeRO shares applied), plus the bytes the
    trace does not hold itself (other microbatches in flight, ZeRO-3 gathers)."""
    factors = zero_factors(layout)
    out = {name: tl.live[i] * factors[name] for i, name in enumerate(CATEGORIES)}
    out["in flight / gathered"] = _in_flight(rt, tl) + _zero3_gathers(rt.trace, layout)
    return out


def _in_flight(rt: RankTrace, tl: Timeline) -> np.ndarray:
    extra = np.zeros(rt.trace.n_ops, dtype=np.float64)
    if rt.in_flight <= 1:
        return extra
    acts = tl.live[CATEGORIES.index("activations")]
    for start, forward_end, end in rt.windows:
        held = max(0, int(acts[forward_end - 1] - (acts[start - 1] if start else 0)))
        extra[start:end] += (rt.in_flight - 1) * held
    return extra


def _zero3_gathers(trace: Trace, layout: Layout) -> np.ndarray:
    extra = np.zeros(trace.n_ops, dtype=np.float64)
    if layout.zero < 3 or layout.dp == 1:
        return extra
    phases = np.asarray(trace.op_phase)
    extra[(phases == FORWARD) | (phases == BACKWARD)] = 2 * gather_unit_bytes(trace)
    return extra


def gather_unit_bytes(trace: Trace) -> int:
    """Parameter bytes of the largest repeated block (``...layers.N``), else of one module, among
    the parameters alive when training starts.

    >>> from probe.simulator.engine_workload import trace_engine
    >>> from probe.simulator.layout import make_layout
    >>> trace = trace_engine("tiny", "reference", "float32", make_layout(global_batch=8)).ranks[0].trace
    >>> gather_unit_bytes(trace) == 4 * (4 * 64 * 64 + 3 * 64 * 172 + 2 * 64)
    True
    """
    nbytes, alloc, free, category = storage_arrays(trace)
    start = window_start(trace)
    alive = (alloc <= start) & (free > start) & (category == CATEGORIES.index("params"))
    per_module: Counter[str] = Counter()
    for key in np.flatnonzero(alive).tolist():
        name = trace.modules[trace.storage_module[key]]
        block = re.match(r"(.*?\.\d+)(\.|$)", name)
        per_module[block.group(1) if block else name] += int(nbytes[key])
    return max(per_module.values(), default=0)


def step_time(ranks: list[RankTrace], seconds: dict[int, np.ndarray], layout: Layout,
              device: Device) -> dict:
    """The job's step time on ``device`` (see the module docstring); ``seconds``: each op's
    seconds per trace (keyed by ``id(trace)``)."""
    stages = []
    for rt in ranks:
        phases = phase_seconds(rt.trace, seconds[id(rt.trace)], rt.timed_step)
        comm = _traced_comm(rt, layout, device)
        sync = _dp_sync(rt, layout, device)
        exposed_sync = sync if rt.dp_sync == "after_backward" else max(0.0, sync - phases["backward"])
        stages.append({"fb": phases["forward"] + phases["backward"] + comm, "phases": phases,
                       "comm": comm, "sync": sync, "exposed_sync": exposed_sync,
                       "rest": phases["other"] + phases["optimizer"] + exposed_sync})
    m = layout.microbatches
    fb = [s["fb"] for s in stages]
    total = sum(fb) + (m - 1) * max(fb) + max(s["rest"] for s in stages)
    worst = max(stages, key=lambda s: s["fb"] + s["rest"])
    per_rank_flops = m * float(np.mean([step_flops(rt.trace, rt.timed_step)[0] for rt in ranks]))
    dtype = _main_dtype(ranks[0].trace)
    peak = device.peak(dtype)
    return {
        "step_time_s": total,
        "compute_s": {k: v * (m if k in ("forward", "backward") else 1) for k, v in worst["phases"].items()},
        "comm_s": worst["comm"] * m + worst["sync"],
        "exposed_comm_s": worst["comm"] * m + worst["exposed_sync"],
        "pipeline_bubble_s": total - m * worst["fb"] - worst["rest"] if layout.pp > 1 else 0.0,
        "stages": [{"label": rt.label, "microbatch_s": s["fb"], "after_s": s["rest"]}
                   for rt, s in zip(ranks, stages)],
        "model_flops_per_rank": int(per_rank_flops),
        "mfu": per_rank_flops / (total * peak) if peak and total > 0 else None,
        "dtype": dtype,
    }


def _traced_comm(rt: RankTrace, layout: Layout, device: Device) -> float:
    """Seconds of the traced tensor/pipeline-parallel collectives of one microbatch."""
    steps = rt.trace.op_step
    total = 0.0
    for c in rt.trace.comms:
        if c.group == "dp" or c.op_index >= len(steps) or steps[c.op_index] != rt.timed_step:
            continue
        total += comm_seconds(c.op, c.nbytes, c.group_size, device,
                              crosses_nodes=group_crosses_nodes(c.group, layout, device))
    return total


def _dp_sync(rt: RankTrace, layout: Layout, device: Device) -> float:
    """Seconds of one step's data-parallel gradient sync for ``layout.zero``."""
    if layout.dp == 1:
        return 0.0
    nbytes, alloc, free, category = storage_arrays(rt.trace)
    alive = free >= rt.trace.n_ops
    params = int(nbytes[(category == CATEGORIES.index("params")) & alive].sum())
    cross = group_crosses_nodes("dp", layout, device)
    if layout.zero == 0:
        return comm_seconds("all_reduce", params, layout.dp, device, crosses_nodes=cross)
    scatter = comm_seconds("reduce_scatter", params, layout.dp, device, crosses_nodes=cross)
    gather = comm_seconds("all_gather", params // layout.dp, layout.dp, device, crosses_nodes=cross)
    return scatter + gather * (3 if layout.zero == 3 else 1)


def _main_dtype(trace: Trace) -> str:
    flops: Counter[str] = Counter()
    for dtype, f in zip(trace.op_dtype, trace.op_flops):
        if f:
            flops[dtype] += f
    return flops.most_common(1)[0][0] if flops else "float32"
