"""Profiling sessions: which steps are recorded, and where their events go.

A :class:`Session` switches :mod:`probe.profiler.mstx` on (through an
:class:`~probe.profiler.event_recorder.EventRecorder`), adds the built-in ranges of
:mod:`probe.profiler.builtin_ranges` (collectives and point-to-point calls, dataloader fetches,
checkpoint saves), optionally torch.profiler's op activity (:mod:`probe.profiler.torch_ops`), and
sends finished events to its sinks: the Arrow record store, a Chrome/Perfetto trace fragment
``OUT/trace/rank<R>.json``, OpenTelemetry spans (streamed while the run goes, nested, to any
span exporter: ``otel_exporter=`` an exporter object, or ``"otlp"`` / ``"console"``), or any
object with ``open/write/close``.

Which steps are kept, either:

- ``schedule=(wait, warmup, active, repeat)`` as ``torch.profiler.schedule`` (``repeat=0``:
  cycle forever), counted from ``first_step``; or
- ``steps={3, 4, 5}``: exactly these step numbers (what ``probe profile --steps`` and the
  monitor's deep trace use); or neither: every step.

``step()`` says the current step ended (as ``torch.profiler.profile.step``). Events belong to
the step during which they started. Ranges still open when recording pauses get their end.
A script's optimizer steps drive a session through :class:`probe.engine_adapter.steps.StepSource`
and :class:`probe.profiler.engine_callbacks.ProfileCallback` (which then also records each step as a
``step N`` range in domain ``step``).

Recording loses nothing by default: ``overflow="block"`` makes a thread that fills its buffer
(``max_buffer`` records between two drains) wait for the drain; ``"spool"`` writes the full
buffer to disk instead; ``"drop"`` drops the excess (see :mod:`probe.profiler.event_recorder`). What
was dropped, spooled or waited is in the report, in the trace (a ``process_labels`` metadata
event of the rank) and in the store (metrics ``mstx_dropped_records``, ``mstx_spilled_records``,
``mstx_wait_ms``).

The simple API for a deep trace of steps S..S+N on one rank (what the monitor agent calls)::

    from probe.profiler.session import Session
    s = Session("runs/x", rank=3, steps=range(S, S + N), first_step=current_step).start()
    ...   # each step: s.step()
    report = s.stop()          # writes runs/x/trace/rank3.json and event records
    print(report.summary())

or with ``profile`` as a context manager (``torch.profiler`` style)::

    from probe.profiler import profile
    with profile("out", schedule=(1, 1, 3, 1)) as prof:
        for batch in data:
            train_step(batch)
            prof.step()

>>> import tempfile
>>> from probe.profiler import mstx
>>> with Session(tempfile.mkdtemp(), trace=True, store=False) as s:
...     with mstx.range("work"):
...         pass
>>> s.report.events
1
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from probe.profiler.builtin_ranges import BuiltinRanges
from probe.profiler.event_recorder import EventRecorder
from probe.profiler.events import DOMAIN_KINDS, Event, EventBatch, describe_problems
from probe.profiler.sinks import StoreSink, TraceMeta, recording_label
from probe.profiler.torch_ops import TorchOps

OFF, WARMUP, ACTIVE = "off", "warmup", "active"


@dataclass
class SessionReport:
    """What a session recorded (``steps``: the steps its events belong to) and what went wrong."""

    rank: int
    events: int
    steps: list[int]
    problems: dict[str, int]
    trace_path: str | None
    clock_offset_ns: int
    sink_errors: list[str] = field(default_factory=list)
    overflow: str = "block"          # what a full buffer did (profiler.event_recorder)
    dropped: int = 0                 # mstx records lost (overflow "drop"; a range is two)
    spilled: int = 0                 # records that went through the spool (overflow "spool")
    wait_ms: float = 0.0             # recording threads' time spent waiting (overflow "block")
    after_last: int = 0              # of ``events``: recorded after the loop's last step ended

    def summary(self) -> str:
        """One line for a human.

        >>> SessionReport(0, 12, [0, 1], {}, None, 0).summary()
        'rank 0: 12 events over steps 0-1'
        >>> SessionReport(0, 5, [0, 1, 2], {}, None, 0, after_last=1).summary()
        'rank 0: 5 events over steps 0-2 (1 after the last step)'
        >>> SessionReport(0, 9, [0], {}, None, 0, overflow="drop", dropped=3).summary()
        'rank 0: 9 events over steps 0-0; 3 mstx records dropped (overflow drop)'
        """
        steps = f"steps {self.steps[0]}-{self.steps[-1]}" if self.steps else "no steps"
        line = f"rank {self.rank}: {self.events} events over {steps}"
        if self.after_last:
            line += f" ({self.after_last} after the last step)"
        if self.dropped:
            line += f"; {self.dropped} mstx records dropped (overflow {self.overflow})"
        if self.spilled:
            line += f"; {self.spilled} records spooled to disk"
        if self.wait_ms >= 1:
            line += f"; recording threads waited {self.wait_ms:.0f} ms for the recorder"
        problems = describe_problems(Counter(self.problems))
        if problems:
            line += f"; input problems: {problems}"
        if self.sink_errors:
            line += f"; sink errors: {'; '.join(self.sink_errors)}"
        return line


class Session:
    """One profiling session on this process (one rank). See the module docstring."""

    def __init__(self, out_dir: str | os.PathLike | None = None, *, rank: int | None = None,
                 world_size: int | None = None, run: str | None = None,
                 store: Any = True, trace: bool = True, otel_exporter: Any = None,
                 otel_processor: str = "batch", sinks: Sequence[Any] = (),
                 schedule: tuple[int, int, int, int] | None = None,
                 steps: Iterable[int] | None = None, first_step: int = 0,
                 domains: Iterable[str] | None = None, comm: bool = True,
                 dataloader: bool = True, checkpoint: bool = True,
                 torch_ops: bool = False, align_clocks: bool = False,
                 clock_offset_ns: int | None = None, align_on_init: bool = True,
                 interval_s: float = 0.05, overflow: str = "block",
                 max_buffer: int = 1_000_000) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.run = run or (self.out_dir.name if self.out_dir is not None else "run")
        if schedule is not None and steps is not None:
            raise ValueError("give either schedule=(wait, warmup, active, repeat) or steps=, not both")
        self.schedule = _check_schedule(schedule) if schedule is not None else None
        self.steps = frozenset(int(s) for s in steps) if steps is not None else None
        self.first_step = int(first_step)
        self.current_step = self.first_step
        self.align_clocks = align_clocks and clock_offset_ns is None
        self.clock_offset_ns = int(clock_offset_ns or 0)
        align_on_init = align_on_init and clock_offset_ns is None
        self.report: SessionReport | None = None
        self._win_steps: list[int | None] = []    # step of each window (None: not kept), append-only
        self._win_starts: list[int] = []          # its start (ns); appended after its step
        self._sinks = self._build_sinks(store, trace, otel_exporter, otel_processor, sinks)
        self._sink_errors: Counter[str] = Counter()
        self._recorder = EventRecorder(self._to_sinks, interval_s=interval_s,
                                       windows=self._step_windows, domains=domains,
                                       overflow=overflow, max_buffer=max_buffer)
        self._builtins = BuiltinRanges(comm=comm, dataloader=dataloader, checkpoint=checkpoint,
                                       after_init=self._align_after_init if align_on_init else None)
        self._torch_ops = TorchOps() if torch_ops else None
        self._counters: list[tuple[int, str, float]] = []
        self._announced: dict[int, tuple[int, str, str, int]] = {}   # open complete ranges
        self._tokens = itertools.count(1)
        self._steps_seen: set[int] = set()
        #: events per step (None: outside any kept step), for a caller that knows its last step
        self.events_by_step: Counter = Counter()
        self._started = False

    # --- public ---------------------------------------------------------------------------
    def start(self) -> "Session":
        """Measure the clock offset (when ``align_clocks``), open the sinks, start recording.

        ``align_clocks=True`` is a collective: every rank must start its session together
        (or measure once with :func:`probe.profiler.clock.measure_offset` and pass
        ``clock_offset_ns=``).
        """
        from probe.profiler.clock import epoch_offset_ns, measure_offset

        if self._started:
            return self
        if self.align_clocks:
            self.clock_offset_ns = measure_offset()
        self._recorder.offset_ns = self.clock_offset_ns
        self.meta = TraceMeta(rank=self.rank, world_size=self.world_size, run=self.run,
                              clock_offset_ns=self.clock_offset_ns,
                              epoch_offset_ns=epoch_offset_ns() - self.clock_offset_ns,
                              thread_names=self._recorder.thread_names,
                              open_ranges=self._open_ranges)
        self._recorder.start()          # raises first if another session records
        for sink in self._sinks:
            self._guard(sink, "open", self.meta)
        self._started = True
        self._builtins.install()
        self._enter(self.current_step, time.perf_counter_ns())
        return self

    def step(self, next_step: int | None = None) -> None:
        """The current step ended; the next one is ``next_step`` (default: current + 1)."""
        if not self._started:
            return
        self.current_step = self.current_step + 1 if next_step is None else int(next_step)
        self._enter(self.current_step, time.perf_counter_ns())

    def counter(self, name: str, value: float) -> None:
        """Add a point to the counter track ``name`` (the trace shows it over time), when the
        current step is recorded.

        >>> s = Session(None, store=False)
        >>> s.counter("loss", 2.5)          # not started: ignored
        """
        if self._started and self.state_of(self.current_step) == ACTIVE:
            try:
                self._counters.append((time.perf_counter_ns() + self.clock_offset_ns, str(name),
                                       float(value)))
            except (TypeError, ValueError):
                pass

    def announce(self, name: str, domain: str, start_ns: int) -> int | None:
        """Say that a range a built-in wrapper measures itself (it will hand it over with
        :func:`probe.profiler.events.emit_complete` when it ends) started at ``start_ns``
        (``time.perf_counter_ns``, this thread), so a sink that streams nested spans sees it
        open meanwhile; :meth:`retire` the token it returns right after the emit.
        """
        if not self._started or self.state_of(self.current_step) == OFF:
            return None
        token = next(self._tokens)
        self._announced[token] = (int(start_ns), str(name), str(domain), threading.get_ident())
        return token

    def retire(self, token: int | None) -> None:
        """The announced range was handed over (see :meth:`announce`)."""
        if token is not None:
            self._announced.pop(token, None)

    def stop(self) -> SessionReport:
        """Stop recording, flush every sink, and return the :class:`SessionReport`."""
        if not self._started:
            return self.report or SessionReport(self.rank, 0, [], {}, None, self.clock_offset_ns)
        self._started = False
        torch_events: list[dict] = []
        if self._torch_ops is not None:
            self._torch_ops.stop(self.meta)
            torch_events = self._torch_ops.events
        self._builtins.remove()
        self._announced.clear()
        recorder = self._recorder
        problems = Counter(recorder.stop())
        dropped = problems.pop("dropped_records", 0)
        recording = {"overflow": recorder.overflow, "dropped_records": dropped,
                     "spilled_records": recorder.spilled, "wait_ms": recorder.wait_ns / 1e6}
        torch_batch = None
        if torch_events:
            torch_batch = self._torch_ops.batch(self._win_starts, self._win_steps, self.clock_offset_ns)
            self._steps_seen.update(torch_batch.step)
            self.events_by_step.update(torch_batch.step)
        for sink in self._sinks:
            if hasattr(sink, "add_raw") and torch_events:
                self._guard(sink, "add_raw", torch_events)
            elif torch_batch is not None and len(torch_batch):
                self._guard(sink, "write", torch_batch)
            if hasattr(sink, "add_counters") and self._counters:
                self._guard(sink, "add_counters", self._counters)
            if hasattr(sink, "add_raw"):
                self._guard(sink, "add_raw", [recording_label(self.rank, recording)])
            if hasattr(sink, "add_recording"):
                last = max(self._steps_seen - {None}, default=self.current_step)
                self._guard(sink, "add_recording", recording, last)
            self._guard(sink, "close")
        trace_path = next((str(s.path) for s in self._sinks if hasattr(s, "add_raw")), None)
        self.report = SessionReport(
            rank=self.rank, events=self._recorder.events_out,
            steps=sorted(s for s in self._steps_seen if s is not None),
            problems=dict(problems), trace_path=trace_path, clock_offset_ns=self.clock_offset_ns,
            sink_errors=[f"{k} (x{v})" for k, v in self._sink_errors.items()],
            overflow=recorder.overflow, dropped=dropped, spilled=recorder.spilled,
            wait_ms=recorder.wait_ns / 1e6)
        return self.report

    def __enter__(self) -> "Session":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- schedule ------------------------------------------------------------------------------
    def state_of(self, step: int) -> str:
        """``off``, ``warmup`` or ``active``: what this session does during ``step``."""
        if self.steps is not None:
            return ACTIVE if step in self.steps else OFF
        if self.schedule is None:
            return ACTIVE
        wait, warmup, active, repeat = self.schedule
        i = step - self.first_step
        cycle = wait + warmup + active
        if i < 0 or (repeat and i >= repeat * cycle):
            return OFF
        pos = i % cycle
        return OFF if pos < wait else WARMUP if pos < wait + warmup else ACTIVE

    def _enter(self, step: int, now: int) -> None:
        state = self.state_of(step)
        self._win_steps.append(step if state == ACTIVE else None)
        self._win_starts.append(now)
        if state == OFF:
            self._recorder.pause()
        else:
            self._recorder.resume()
        if self._torch_ops is not None:
            if state == ACTIVE:
                self._torch_ops.start()
            else:
                self._torch_ops.stop(self.meta)

    def _step_windows(self) -> tuple[list[int], list[int | None]]:
        return self._win_starts, self._win_steps

    def _open_ranges(self) -> list[Event]:
        """The ranges open now that will be kept (their step recorded, their domain wanted), as
        events with ``end_ns`` -1; read by the drain thread (which alone changes the pairer)."""
        recorder = self._recorder
        raw = list(recorder.pairer.open_ranges.values()) + list(self._announced.values())
        if not raw:
            return []
        starts = self._win_starts
        k = len(starts)
        steps = self._win_steps
        off = recorder.offset_ns
        out = []
        for t0, message, domain, tid in raw:
            if type(message) is not str or type(domain) is not str:
                continue
            if recorder.domains is not None and domain not in recorder.domains:
                continue
            i = bisect_right(starts, t0, 0, k) - 1
            step = steps[i] if i >= 0 else None
            if step is not None:
                out.append(Event(domain, message, DOMAIN_KINDS.get(domain, "range"), t0 + off, -1,
                                 tid, tid, None, None, None, step))
        return out

    # --- sinks -----------------------------------------------------------------------------
    def _build_sinks(self, store: Any, trace: bool, otel_exporter: Any, otel_processor: str,
                     extra: Sequence[Any]) -> list[Any]:
        sinks: list[Any] = []
        if store is True and self.out_dir is not None:
            from probe.collectors.store import StoreWriter

            sinks.append(StoreSink(StoreWriter(self.out_dir, rank=self.rank, run=self.run),
                                   own_store=True))
        elif store not in (None, False, True):
            sinks.append(StoreSink(store, own_store=False))
        if trace and self.out_dir is not None:
            from probe.collectors.perfetto import ChromeTraceSink

            sinks.append(ChromeTraceSink(self.out_dir / "trace" / f"rank{self.rank}.json"))
        if otel_exporter is not None:
            from probe.collectors.otel import OTelSink

            if isinstance(otel_exporter, str):
                from probe.collectors.otel import span_exporter_from

                otel_exporter = span_exporter_from(otel_exporter)
            sinks.append(OTelSink(otel_exporter, processor=otel_processor,
                                  describe=getattr(otel_exporter, "probe_endpoint", "")))
        sinks.extend(extra)
        return sinks

    def _to_sinks(self, events: EventBatch) -> None:
        self._steps_seen.update(events.step)
        self.events_by_step.update(events.step)
        for sink in self._sinks:
            self._guard(sink, "write", events)

    def _guard(self, sink: Any, method: str, *args: Any) -> None:
        try:
            getattr(sink, method)(*args)
        except Exception as e:  # noqa: BLE001 - one failing sink must not stop the others
            self._sink_errors[f"{type(sink).__name__}.{method}: {type(e).__name__}: {e}"[:200]] += 1

    # --- clock alignment of a script's process group --------------------------------------------
    def _align_after_init(self) -> None:
        """Right after a script's ``init_process_group`` (every rank calls it together): measure
        this rank's clock offset. Events drained before that keep offset 0."""
        import torch.distributed as dist

        try:
            self._set_offset(dist.get_rank(), dist.get_world_size())
        except Exception as e:  # noqa: BLE001 - no alignment is better than a failed init
            self._sink_errors[f"clock alignment: {type(e).__name__}: {e}"[:200]] += 1

    def _set_offset(self, rank: int, world_size: int) -> None:
        from probe.profiler.clock import epoch_offset_ns, measure_offset

        offset = measure_offset()
        self.clock_offset_ns = offset
        self._recorder.offset_ns = offset
        self.meta.rank, self.meta.world_size = self.rank, self.world_size = rank, world_size
        self.meta.clock_offset_ns = offset
        self.meta.epoch_offset_ns = epoch_offset_ns() - offset


def _check_schedule(schedule: Any) -> tuple[int, int, int, int]:
    try:
        values = tuple(int(v) for v in schedule)
    except (TypeError, ValueError):
        raise ValueError(f"schedule {schedule!r}: give (wait, warmup, active, repeat) as integers") from None
    if len(values) == 3:
        values = values + (0,)
    if len(values) != 4 or min(values) < 0 or values[2] < 1:
        raise ValueError(f"schedule {schedule!r}: give (wait, warmup, active, repeat) with "
                         "active >= 1 and no negative value")
    return values  # type: ignore[return-value]


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist_rank = dist_world = None
    torch = sys.modules.get("torch")
    if torch is not None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist_rank, dist_world = dist.get_rank(), dist.get_world_size()
    if rank is None:
        rank = dist_rank if dist_rank is not None else int(os.environ.get("RANK", 0))
    if world_size is None:
        world_size = dist_world if dist_world is not None else int(os.environ.get("WORLD_SIZE", 1))
    return int(rank), int(world_size)


def profile(out_dir: str | os.PathLike | None = None, *,
            schedule: tuple[int, int, int, int] | None = None, **kwargs: Any) -> Session:
    """A :class:`Session` (use as a context manager, call ``.step()`` each step).

    >>> import tempfile
    >>> from probe.profiler import mstx
    >>> with profile(tempfile.mkdtemp(), schedule=(0, 1, 1, 1), store=False) as prof:
    ...     for i in range(3):
    ...         mstx.mark(f"step {i}")
    ...         prof.step()
    >>> prof.report.steps, prof.report.events
    ([1], 1)
    """
    return Session(out_dir, schedule=schedule, **kwargs)
