"""The profiler as training callbacks (:mod:`probe.engine_adapter.callbacks`) of the bundled engine or any loop.

- :class:`FlopsCallback` counts the FLOPs of a step with :class:`probe.profiler.flops.FlopCounter`
  (on the first step, and again every ``recount_every`` steps) and adds ``flops`` (model FLOPs),
  ``hw_flops``, ``achieved_tflops``, ``mfu`` and ``hfu`` to each step's metrics dict, so later
  callbacks (the monitor agent) and the store see them, as MindSpore's
  FlopsUtilizationCollector does, for any op.
- :class:`ProfileCallback` runs a :class:`probe.profiler.session.Session` over the selected steps of
  every rank (clocks aligned at start, or right after a script's ``init_process_group``),
  includes a FlopsCallback, and puts the step metrics in :data:`COUNTERS` on counter tracks of
  the trace.

Use them through :class:`~probe.engine_adapter.callbacks.CallbackSpec` in the bundled engine::

    RunSpec(..., callbacks=(CallbackSpec(ProfileCallback, {"steps": [0, 1, 2], "peak_tflops": 0.2}),))

or on any script's optimizer steps with :class:`probe.engine_adapter.steps.StepSource` (what
``probe profile -- SCRIPT`` does; ``step_ranges=True`` records each step as a range, since a
script marks none)::

    with StepSource(get_adapter("torch"), [ProfileCallback(step_ranges=True)], "runs/prof"):
        train()
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

from probe.engine_adapter.callbacks import TrainCallback, TrainContext
from probe.profiler.events import emit_complete

log = logging.getLogger(__name__)


#: Step metrics shown as counter tracks in the trace.
COUNTERS = ("loss", "step_time_ms", "tokens_per_s", "grad_norm", "mfu", "hfu")


class FlopsCallback(TrainCallback):
    """Adds ``flops``, ``hw_flops``, ``achieved_tflops``, ``mfu``, ``hfu`` to step metrics.

    ``peak_tflops``: the device's peak (per rank); without it a GPU's is looked up in
    :data:`probe.profiler.flops.PEAK_TFLOPS` for the dtype most FLOPs ran in (so autocast counts as
    its compute dtype), and a CPU gets FLOPs but no MFU/HFU.
    ``recount_every``: count again every N steps (shapes that change); 0 counts once.
    A loop without a model in its context (a script's steps) gets the peak only from
    ``peak_tflops``.

    >>> import tempfile, torch
    >>> from probe.engine_adapter.base import get_adapter
    >>> from probe.engine_adapter.steps import StepSource
    >>> model = torch.nn.Linear(16, 16)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with StepSource(get_adapter("torch"), [FlopsCallback(peak_tflops=1)], tempfile.mkdtemp()) as source:
    ...     for _ in range(2):
    ...         model(torch.randn(4, 16)).sum().backward(); opt.step()
    >>> [s["step"] for s in source.steps], source.steps[0]["flops"] == 2 * 2 * 4 * 16 * 16
    ([0, 1], True)
    >>> sorted(source.steps[0])
    ['achieved_tflops', 'flops', 'hfu', 'hw_flops', 'mfu', 'step', 'step_time_ms']
    """

    def __init__(self, peak_tflops: float | None = None, recount_every: int = 0) -> None:
        self.peak_tflops = peak_tflops
        self.recount_every = int(recount_every)
        self.peak: float | None = None
        self.model_flops: int | None = None
        self.hardware_flops: int | None = None
        self._counter: Any = None
        self._counted_step: int | None = None

    def on_train_start(self, ctx: TrainContext) -> None:
        from probe.profiler.flops import peak_flops

        dtype = next((p.dtype for p in ctx.model.parameters()), None) if ctx.model is not None else None
        self.peak = peak_flops(ctx.device, dtype, self.peak_tflops)

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        due = self.model_flops is None or (
            self.recount_every > 0 and self._counted_step is not None
            and step - self._counted_step >= self.recount_every)
        if due:
            from probe.profiler.flops import FlopCounter

            self._counter = FlopCounter()
            self._counter.__enter__()

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        from probe.profiler.flops import utilisation

        if self._counter is not None:
            counter, self._counter = self._counter, None
            counter.__exit__(None, None, None)
            self.model_flops, self.hardware_flops = counter.model_flops, counter.hardware_flops
            self._counted_step = step
            if self.peak_tflops is None and counter.main_dtype is not None:
                from probe.profiler.flops import peak_flops

                self.peak = peak_flops(ctx.device, counter.main_dtype) or self.peak
        if self.model_flops is None:
            return
        seconds = metrics.get("step_time_ms", 0.0) / 1e3
        metrics["flops"] = float(self.model_flops)
        metrics["hw_flops"] = float(self.hardware_flops)
        if seconds > 0:
            metrics["achieved_tflops"] = self.model_flops / seconds / 1e12
        mfu = utilisation(self.model_flops, seconds, self.peak)
        hfu = utilisation(self.hardware_flops, seconds, self.peak)
        if mfu is not None:
            metrics["mfu"] = mfu
            metrics["hfu"] = hfu

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None


class ProfileCallback(TrainCallback):
    """Profiles the selected steps of each rank of the bundled engine.

    ``steps``: step numbers to record (None: all); ``ranks``: ranks to record (None: all; every
    rank still takes part in the clock-offset exchange); ``schedule``: (wait, warmup, active, repeat)
    instead; ``trace``: write ``OUT/trace/rank<R>.json``; ``otel``: ``"otlp"`` to stream spans
    over OTLP (configured by the ``OTEL_EXPORTER_OTLP_*`` variables), ``"console"`` to print
    them (an exporter object can be given in-process); ``torch_ops``: add torch.profiler's op
    activity; ``flops``: add FLOPs/MFU/HFU to step metrics (``peak_tflops`` as FlopsCallback);
    ``step_ranges``: record each step as a ``step N`` range in domain ``step`` (for a loop that
    marks none, such as a script's optimizer steps; the payload names the context's
    ``extra["step_source"]``); ``overflow`` (``block``, ``spool`` or ``drop``) and ``max_buffer``:
    what a thread's full mstx buffer does, as :class:`probe.profiler.session.Session` (the default
    loses nothing).
    """

    def __init__(self, steps: Iterable[int] | None = None,
                 schedule: tuple[int, int, int, int] | None = None, trace: bool = True,
                 otel: Any = None, torch_ops: bool = False, flops: bool = True,
                 peak_tflops: float | None = None, recount_every: int = 0,
                 domains: Iterable[str] | None = None, ranks: Iterable[int] | None = None,
                 step_ranges: bool = False, overflow: str = "block",
                 max_buffer: int = 1_000_000) -> None:
        self.ranks = set(ranks) if ranks is not None else None
        self.steps = list(steps) if steps is not None else None
        self.schedule = tuple(schedule) if schedule is not None else None
        self.trace = trace
        self.otel = otel
        self.torch_ops = torch_ops
        self.domains = list(domains) if domains is not None else None
        self.flops = FlopsCallback(peak_tflops, recount_every) if flops else None
        self.step_ranges = step_ranges
        self.overflow = overflow
        self.max_buffer = max_buffer
        self.session: Any = None
        self.report: Any = None
        self._step_start_ns = 0
        self._step_token: int | None = None

    def on_train_start(self, ctx: TrainContext) -> None:
        from probe.profiler.clock import group_is_up, measure_offset
        from probe.profiler.session import Session

        if self.flops is not None:
            self.flops.on_train_start(ctx)
        # no process group yet (a script creates its own): the session measures right after it
        offset = measure_offset() if group_is_up() else None
        if self.ranks is not None and ctx.rank not in self.ranks:
            return
        self.session = Session(
            ctx.out_dir, rank=ctx.rank, world_size=ctx.world_size, run=ctx.run, store=ctx.store,
            trace=self.trace, otel_exporter=otel_exporter_from(self.otel), steps=self.steps,
            schedule=self.schedule, first_step=0, domains=self.domains,
            torch_ops=self.torch_ops, clock_offset_ns=offset, overflow=self.overflow,
            max_buffer=self.max_buffer).start()

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        if self.flops is not None:
            self.flops.on_step_start(ctx, step)
        if self.step_ranges:
            self._step_start_ns = time.perf_counter_ns()
            if self.session is not None:         # open meanwhile, for spans streamed nested in it
                self._step_token = self.session.announce(f"step {step}", "step", self._step_start_ns)

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        self._last_ended = step
        if self.flops is not None:
            self.flops.on_step_end(ctx, step, metrics)
        if self.session is not None:
            if self.step_ranges:
                emit_complete(f"step {step}", "step", self._step_start_ns, time.perf_counter_ns(),
                              {"step": step, "source": ctx.extra.get("step_source")})
                self.session.retire(self._step_token)     # after the emit: never unseen between
                self._step_token = None
            for name in COUNTERS:
                if isinstance(metrics.get(name), (int, float)):
                    self.session.counter(name, metrics[name])
            self.session.step(step + 1)

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        if self.flops is not None:
            self.flops.on_train_end(ctx, error)
        if self.session is not None:
            self.report = self.session.stop()
            last = getattr(self, "_last_ended", None)
            if self.step_ranges and last is not None:
                # a script's loop ended with its last optimizer step: what it recorded after
                # (a closing mark) is said as such, not counted as one more step
                after = [s for s in self.report.steps if s > last]
                self.report.after_last = sum(self.session.events_by_step[s] for s in after)
                self.report.steps = [s for s in self.report.steps if s <= last]
            if self.report.problems or self.report.sink_errors or self.report.dropped:
                log.warning(f"probe: profile {self.report.summary()}")


def otel_exporter_from(otel: Any) -> Any:
    """The span exporter an ``otel`` option names (:func:`probe.collectors.otel.span_exporter_from`):
    ``"otlp"`` (configured by the ``OTEL_EXPORTER_OTLP_*`` variables), ``"console"``; an
    exporter object passes through; None stays None.

    >>> otel_exporter_from(None) is None
    True
    """
    if otel is None or otel is False:
        return None
    from probe.collectors.otel import span_exporter_from

    return span_exporter_from(otel)
