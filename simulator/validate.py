"""Predicted against measured: the bundled engine simulated, then run for real on this machine.

One rank, the preset as it is, float32. On the CPU:

- **peak memory**: the level-2 peak (the CPU allocator: requested bytes, plus kernel
  workspaces) against the peak of the bytes the c10 CPU allocator holds, read from
  ``torch.profiler``'s memory events (``profile_memory=True``: every allocation and free the
  allocator reports, summed in time order), over the same two steps; within 10%;
- **step time** (needs ``--calibrate``): the level-3 step time against the real steps after
  the first of three runs (one before the simulation, two after: a run's loop goes at different
  speeds from run to run here, far less from step to step), each step timed by a training
  callback from ``on_step_start`` to ``on_step_end`` on the calibration's clock (a thread's CPU
  time when torch runs one thread, so other work on a shared machine does not count), the
  fastest of them as the calibration takes the fastest of its batches; within 30% of the range
  the three runs' fastest steps span. That range is the machine's own: here the same engine
  and preset ran its fastest step in 9.5 ms in one run and 16.5 ms in the next (its ops,
  replayed alone, 9.2 ms both times).

On CUDA, where a GPU is present (else no checks, and the caller says it skipped): peak from
``torch.cuda.max_memory_allocated`` against the level-2 *allocated* peak on the GPU's device
entry, within 10%; the engine's own ``step_time_ms`` (wall, the fastest step after the first)
against level 3, within 25%.

>>> checks = validate_cpu("tiny", time=False)
>>> [(c.what, c.ok) for c in checks]
[('peak memory', True)]
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import torch

from probe.engine.config import get_preset
from probe.engine_adapter.callbacks import CallbackSpec, TrainCallback
from probe.ground.errors import ProbeError
from probe.simulator.clock import clock_for, clock_name
from probe.simulator.devices import Device, all_devices, this_cpu
from probe.simulator.engine_workload import TRACED_STEPS, trace_engine
from probe.simulator.layout import make_layout
from probe.simulator.replay import replay_seconds
from probe.simulator.simulation import simulate

MEMORY_TOLERANCE = 0.10
CPU_TIME_TOLERANCE = 0.30
CUDA_TIME_TOLERANCE = 0.25


@dataclass
class Check:
    """One predicted-against-measured figure."""

    what: str
    device: str
    predicted: float
    measured: float
    tolerance: float
    how: str
    slowest: float | None = None

    @property
    def error(self) -> float:
        """Predicted against measured; where the machine's runs spread (``slowest``), against
        the nearer end of the range they spanned (0 inside it)."""
        if not self.measured:
            return float("inf")
        high = max(self.slowest or self.measured, self.measured)
        if self.measured <= self.predicted <= high:
            return 0.0
        return self.predicted / (self.measured if self.predicted < self.measured else high) - 1

    @property
    def ok(self) -> bool:
        return abs(self.error) <= self.tolerance


class StepClock(TrainCallback):
    """Times each step from ``on_step_start`` to ``on_step_end`` into ``sink`` (seconds)."""

    def __init__(self, sink: list[float], clock: str, wall: list[float] | None = None) -> None:
        self.sink, self.clock, self.wall = sink, clock_for(clock), wall
        self.started = 0.0

    def on_step_start(self, ctx, step: int) -> None:
        self.started = self.clock()

    def on_step_end(self, ctx, step: int, metrics: dict) -> None:
        self.sink.append(self.clock() - self.started)
        if self.wall is not None:
            self.wall.append(metrics["step_time_ms"] / 1e3)


def validate_cpu(preset: str, engine: str = "reference", *, time: bool = True,
                 time_steps: int = 8) -> list[Check]:
    """Checks of ``preset`` on this machine's CPU (see the module docstring)."""
    cpu = this_cpu()
    if time and not cpu.curves:
        raise ProbeError("--validate checks step time against a calibration of this machine: "
                         "run 'probe simulate --calibrate' first")
    if time and cpu.curves.get("threads") != torch.get_num_threads():
        raise ProbeError(f"this machine was calibrated with {cpu.curves.get('threads')} thread(s) and "
                         f"torch now uses {torch.get_num_threads()}; calibrate again with the same "
                         "OMP_NUM_THREADS as the run to validate")
    cfg = get_preset(preset)
    layout = make_layout(nproc=1, global_batch=cfg.global_batch)
    clock = clock_name(torch.device("cpu"))
    steps: list[list[float]] = []
    if time:
        steps.append(_timed_steps(preset, engine, time_steps, clock))
    traced = trace_engine(preset, engine, "float32", layout, signatures=time)
    measured = {id(rt.trace): replay_seconds(rt.trace, cpu) for rt in traced.ranks} if time else None
    sim = simulate(traced, layout, level=3 if time else 2, device=cpu, measured=measured)
    peak = sim.worst(cpu.name).memory["peak"]
    checks = [Check("peak memory", "cpu", peak, _cpu_allocator_peak(preset, engine),
                    MEMORY_TOLERANCE, "c10 CPU allocator bytes (torch.profiler memory events)")]
    if time:
        steps += [_timed_steps(preset, engine, time_steps, clock) for _ in range(2)]
        fastest = [min(run[1:]) for run in steps]
        checks.append(Check("step time", "cpu", sim.times[cpu.name]["step_time_s"],
                            min(fastest), CPU_TIME_TOLERANCE,
                            f"fastest of steps 1-{time_steps - 1} of three runs "
                            f"(the slowest run's fastest {max(fastest) * 1e3:.1f} ms), "
                            f"{clock.replace('_', ' ')} clock", slowest=max(fastest)))
    return checks


def _timed_steps(preset: str, engine: str, steps: int, clock: str) -> list[float]:
    """Seconds of each step of a real run on the CPU, on ``clock``."""
    sink: list[float] = []
    _run(preset, engine, "cpu", steps, CallbackSpec(StepClock, {"sink": sink, "clock": clock}))
    return sink


def validate_cuda(preset: str, engine: str = "reference", *, time_steps: int = 6) -> list[Check]:
    """Checks of ``preset`` on this machine's GPU; none when CUDA is not available."""
    if not torch.cuda.is_available():
        return []
    device = _this_gpu()
    cfg = get_preset(preset)
    layout = make_layout(nproc=1, global_batch=cfg.global_batch)
    traced = trace_engine(preset, engine, "float32", layout, signatures=bool(device.curves))
    measured = ({id(rt.trace): replay_seconds(rt.trace, device) for rt in traced.ranks}
                if device.curves else None)
    sim = simulate(traced, layout, level=3, device=device, measured=measured)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    clock: list[float] = []
    wall: list[float] = []
    _run(preset, engine, "cuda", time_steps, CallbackSpec(StepClock, {"sink": clock, "clock": "wall",
                                                                       "wall": wall}))
    measured_peak = torch.cuda.max_memory_allocated() - base
    checks = [Check("peak memory", device.name, sim.worst(device.name).memory["peak"], measured_peak,
                    MEMORY_TOLERANCE, "torch.cuda.max_memory_allocated")]
    if device.name in sim.times:
        checks.append(Check("step time", device.name, sim.times[device.name]["step_time_s"],
                            min(wall[1:]), CUDA_TIME_TOLERANCE,
                            f"fastest step_time_ms of steps 1-{time_steps - 1}"))
    return checks


def _this_gpu() -> Device:
    name = torch.cuda.get_device_name()
    table = all_devices()
    for key, device in table.items():
        if key in name or device.name == name:
            return device
    props = torch.cuda.get_device_properties(0)
    return Device(name=name, kind="cuda", memory_bytes=props.total_memory, peak_flops={},
                  memory_bw=0.0, link_intra_bw=0.0, link_inter_bw=0.0, ranks_per_node=1,
                  link_latency_s=0.0, launch_s=0.0, source="unknown GPU (memory only)")


def _run(preset: str, engine: str, device: str, steps: int, *callbacks: CallbackSpec) -> None:
    from probe.engine.spec import RunSpec
    from probe.engine.train import run_rank

    with tempfile.TemporaryDirectory(prefix="probe-validate-") as out:
        spec = RunSpec(engine=engine, preset=preset, max_steps=steps, out_dir=out, quiet=True,
                       device=device, fsync="never", owner="simulate", callbacks=callbacks)
        run_rank(spec, 0, 1)


def _cpu_allocator_peak(preset: str, engine: str) -> int:
    """Peak bytes held by the c10 CPU allocator over a real run of ``TRACED_STEPS`` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _run(preset, engine, "cpu", TRACED_STEPS)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for e in events:
        if e.device_type() == torch.autograd.DeviceType.CPU:
            held += e.nbytes()
            peak = max(peak, held)
    return peak
