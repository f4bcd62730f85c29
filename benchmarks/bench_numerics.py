"""Per-module numerics: what they add to a training step, and what judging them costs the service.

1. **Step overhead** (``--overhead``): the bundled engine's ``small`` preset (27M parameters,
   57 leaf modules with parameters) on the CPU, one rank streaming to a monitor service in this
   process, with :class:`probe.monitor.agent.numerics_callback.NumericsCallback` on every leaf module
   measuring every other step (``every=2``): each measured step is compared with the unmeasured
   one after it, so the drift of a shared machine hits both alike. A step is timed from one
   ``on_step_start`` to the next, wall clock and process CPU time: forward (the activation
   hooks), backward, the optimizer (after its step: weights, gradients, AdamW's moments and the
   update read from them, one native pass) and the step's end (one gather, the points queued).
   Printed: the median step with and without, and the median ratio of the pairs. Goal: under
   3% added.
2. **Detection cost** (``--detect``): a simulated job of ``--ranks`` ranks x ``--modules``
   modules (6 points per module and step: 19,200 a step at 64 x 50) stored in a monitor store
   as the agents' batches would be; then, step by step as the service's detector thread does,
   the step's ``numerics:*`` points are queried, put in the job's
   :class:`probe.monitor.detectors.numerics_window.NumericsWindow` and judged. Printed: per step, the query,
   the window (parse and derive) and the detectors, median and 95th percentile, with healthy
   series and with one layer growing 1.3x a step from step 150 (so the alert path is timed too).

    python benchmarks/bench_numerics.py --overhead --steps 20
    python benchmarks/bench_numerics.py --detect --ranks 64 --modules 50 --steps 250
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from probe.engine_adapter.callbacks import TrainCallback  # noqa: E402


class TimedNumerics:
    """A NumericsCallback factory that remembers the instance it built (picklable by name)."""

    built: list = []

    def __new__(cls, **kwargs):
        from probe.monitor.agent.numerics_callback import NumericsCallback

        cb = NumericsCallback(**kwargs)
        TimedNumerics.built.append(cb)
        return cb


class StepClock(TrainCallback):
    """Records each step's wall and process CPU time, from one step start to the next (the
    whole step, every callback included)."""

    wall: list[float] = []
    cpu: list[float] = []

    def __init__(self) -> None:
        self._t = None

    def _tick(self) -> None:
        now = (time.perf_counter(), time.process_time())
        if self._t is not None:
            StepClock.wall.append(now[0] - self._t[0])
            StepClock.cpu.append(now[1] - self._t[1])
        self._t = now

    def on_step_start(self, ctx, step):
        self._tick()

    def on_train_end(self, ctx, error=None):
        self._tick()


def overhead(steps: int, preset: str, warmup: int) -> dict[str, float]:
    """One run measuring numerics on every other step (``every=2``): each measured step is
    paired with the unmeasured step after it, so the machine's drift (other work on a shared
    machine moves a step by tens of percent from minute to minute) hits both alike."""
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec
    from probe.engine_adapter.callbacks import CallbackSpec
    from probe.monitor.service.server import MonitorService

    tmp = Path(tempfile.mkdtemp(prefix="bench-numerics-"))
    service = MonitorService(tmp / "monitor.duckdb", port=0)
    port = service.start()
    os.environ["PROBE_MONITOR"] = f"127.0.0.1:{port}"
    os.environ["PROBE_MONITOR_JOB"] = "bench"
    StepClock.wall, StepClock.cpu = [], []
    try:
        spec = RunSpec(preset=preset, max_steps=2 * steps + warmup, quiet=True, force=True,
                       fsync="never", out_dir=str(tmp / "run"),
                       callbacks=(CallbackSpec(StepClock),
                                  CallbackSpec(TimedNumerics, {"every": 2})))
        run_training(spec)
        judged = service.store.numerics_points("bench", 0, 1 << 40).num_rows
        if not judged:
            raise SystemExit("the service stored no numerics points")
    finally:
        service.stop(grace=0)
        os.environ.pop("PROBE_MONITOR", None)
    out: dict[str, float] = {"points": judged}
    own = TimedNumerics.built[-1].seconds / ((2 * steps + warmup + 1) // 2)
    out["own_ms"] = own * 1e3
    for name, times in (("wall", StepClock.wall), ("cpu", StepClock.cpu)):
        first = warmup + (warmup % 2)                   # an even step: a measured one
        on = times[first::2]
        off = times[first + 1::2]
        pairs = [a / b for a, b in zip(on, off) if b > 0]
        out[f"{name}_on_ms"] = statistics.median(on) * 1e3
        out[f"{name}_off_ms"] = statistics.median(off) * 1e3
        out[f"{name}_ratio"] = statistics.median(pairs)
        # 90% interval of that median (bootstrap over the pairs): how far the machine's noise
        # lets the figure move
        rng = np.random.default_rng(0)
        meds = np.median(rng.choice(np.asarray(pairs), size=(2000, len(pairs))), axis=1)
        out[f"{name}_lo"], out[f"{name}_hi"] = (float(x) for x in np.percentile(meds, [5, 95]))
        out["pairs"] = len(pairs)
    return out


def _simulated_points(ranks: int, modules: int, step: int, rng, grow_from: int | None):
    import pyarrow as pa

    from probe.monitor.numerics_names import QUANTITIES, metric_name

    names = [metric_name(f"layers.{m // 9}.part{m % 9}", q) for m in range(modules)
             for q in QUANTITIES]
    base = np.array([10.0, 5.0, 0.5, 1e-3, 0.05, 0.0])
    noise = np.exp(rng.normal(0, [0.1, 0.002, 0.1, 0.1, 0.05, 0.0], size=(ranks, modules, 6)))
    v = base[None, None] * noise
    if grow_from is not None and step >= grow_from:
        v[:, 7, 1] *= 1.3 ** (step - grow_from)          # one layer's weights grow
        v[:, 7, 0] *= 1.3 ** (step - grow_from)
    n = ranks * modules * 6
    t0 = 1_000_000_000 * step
    return pa.table({
        "time_ns": np.repeat(t0 + np.arange(modules) * 1000, 6)[None].repeat(ranks, 0).reshape(-1),
        "job": ["sim"] * n,
        "rank": pa.array(np.repeat(np.arange(ranks), modules * 6), pa.int32()),
        "step": np.full(n, step, np.int64),
        "name": names * ranks,
        "value": v.reshape(-1),
    })


def detect_cost(ranks: int, modules: int, steps: int, grow_from: int | None) -> dict[str, float]:
    from probe.monitor.detectors.numerics import ModuleMatrix
    from probe.monitor.detectors.numerics_window import NumericsWindow
    from probe.monitor.service.detection import AlertBook
    from probe.monitor.service.storage import BatchKey, MonitorStore

    tmp = Path(tempfile.mkdtemp(prefix="bench-numerics-detect-"))
    store = MonitorStore(tmp / "m.duckdb")
    rng = np.random.default_rng(0)
    window, book = NumericsWindow("sim"), AlertBook()
    q_t, w_t, j_t, opened = [], [], [], []
    for step in range(steps):
        table = _simulated_points(ranks, modules, step, rng, grow_from)
        store.ingest([BatchKey("sim", 0, "agent", step + 1, 0, step)], [table])
        t0 = time.perf_counter()
        points = store.numerics_points("sim", step, step)
        t1 = time.perf_counter()
        window.append(ModuleMatrix.from_points(points, "sim"))
        t2 = time.perf_counter()
        found = window.judge([step])
        t3 = time.perf_counter()
        for a in found:
            merged, new = book.merge(a)
            if new:
                opened.append(merged)
        q_t.append(t1 - t0), w_t.append(t2 - t1), j_t.append(t3 - t2)
    store.close()

    def ms(xs, pct=50):
        return float(np.percentile(np.asarray(xs[20:]) * 1e3, pct))

    total = [a + b + c for a, b, c in zip(q_t, w_t, j_t)]
    first = min((a["step"] for a in opened), default=None)
    named = sorted({(a["kind"], a["module"], a["quantity"]) for a in opened})
    return {"query_ms": ms(q_t), "window_ms": ms(w_t), "judge_ms": ms(j_t),
            "total_ms": ms(total), "total_p95_ms": ms(total, 95), "alerts": len(opened),
            "first_alert_step": first, "named": named}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--overhead", action="store_true", help="the step overhead (small preset, CPU)")
    p.add_argument("--detect", action="store_true", help="the service's detection cost")
    p.add_argument("--preset", default="small")
    p.add_argument("--steps", type=int, default=None,
                   help="pairs of steps (overhead, default 20) or simulated steps (detect, 250)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out at each block's start")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--modules", type=int, default=50)
    args = p.parse_args()
    if not (args.overhead or args.detect):
        args.overhead = args.detect = True
    if args.overhead:
        print(f"step overhead: {args.preset} preset, CPU, numerics on every leaf module, "
              f"measured on every other step", flush=True)
        r = overhead(args.steps or 20, args.preset, args.warmup)
        print(f"  the callback's own work: {r['own_ms']:.1f} ms a measured step = "
              f"{r['own_ms'] / r['wall_off_ms'] * 100:.2f}% of the median unmeasured step")
        for name in ("wall", "cpu"):
            print(f"  {name:>4}: median step without numerics {r[name + '_off_ms']:.1f} ms, with "
                  f"{r[name + '_on_ms']:.1f} ms; median ratio of {r['pairs']} pairs "
                  f"{r[name + '_ratio']:.4f} ({(r[name + '_ratio'] - 1) * 100:+.2f}%, 90% interval "
                  f"{(r[name + '_lo'] - 1) * 100:+.1f}..{(r[name + '_hi'] - 1) * 100:+.1f}%; goal < +3%)")
    if args.detect:
        for label, grow in (("healthy", None), ("one layer growing 1.3x a step from step 150", 150)):
            r = detect_cost(args.ranks, args.modules, args.steps or 250, grow)
            print(f"detection, {args.ranks} ranks x {args.modules} modules, {label}: per step "
                  f"query {r['query_ms']:.1f} ms + window {r['window_ms']:.1f} ms + detectors "
                  f"{r['judge_ms']:.1f} ms = {r['total_ms']:.1f} ms median, "
                  f"{r['total_p95_ms']:.1f} ms p95; {r['alerts']} alerts opened"
                  + (f", first at step {r['first_alert_step']}: {r['named'][:4]}" if r["alerts"]
                     else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
