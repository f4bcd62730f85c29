"""Profiling sessions: which steps are recorded, and where their events go.

A :class:`Session` switches :mod:`profiler.mstx` on, adds the built-in ranges (every
``torch.distributed`` collective and point-to-point call in domain ``communication``;
dataloader fetches in domain ``dataloader``; ``torch.save`` and (when loaded)
``torch.distributed.checkpoint.save`` in domain ``checkpoint``; optionally
one ``step N`` range per optimizer step in domain ``step``), and sends finished events to its
sinks: the Arrow record store, a Chrome/Perfetto trace fragment ``OUT/trace/rank<R>.json``,
OpenTelemetry spans, or any object with ``open/write/close``.

Which steps are kept, either:

- ``schedule=(wait, warmup, active, repeat)`` as ``torch.profiler.schedule`` (``repeat=0``:
  cycle forever), counted from ``first_step``; or
- ``steps={3, 4, 5}``: exactly these step numbers (what ``probe profile --steps`` and the
  monitor's deep trace use); or neither: every step.

``step()`` says the current step ended (as ``torch.profiler.profile.step``). Events belong to
the step during which they started. Ranges still open when recording pauses get their end.

The simple API for a deep trace of steps S..S+N on one rank (what the monitor agent calls)::

    from profiler.session import Session
    s = Session("runs/x", rank=3, steps=range(S, S + N), first_step=current_step).start()
    ...   # each step: s.step()
    report = s.stop()          # writes runs/x/trace/rank3.json and event records
    print(report.summary())

or with ``profile`` as a context manager (``torch.profiler`` style)::

    from profiler import profile
    with profile("out", schedule=(1, 1, 3, 1)) as prof:
        for batch in data:
            train_step(batch)
            prof.step()

>>> import tempfile
>>> from profiler import mstx
>>> with Session(tempfile.mkdtemp(), trace=True, store=False) as s:
...     with mstx.range("work"):
...         pass
>>> s.report.events
1
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from profiler.event_recorder import EventRecorder
from profiler.events import Event, EventBatch, describe_problems, emit_complete
from profiler.sinks import StoreSink, TraceMeta

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

    def summary(self) -> str:
        """One line for a human.

        >>> SessionReport(0, 12, [0, 1], {}, None, 0).summary()
        'rank 0: 12 events over steps 0-1'
        """
        steps = f"steps {self.steps[0]}-{self.steps[-1]}" if self.steps else "no steps"
        line = f"rank {self.rank}: {self.events} events over {steps}"
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
                 optimizer_steps: bool = False, dataloader: bool = True, checkpoint: bool = True,
                 torch_ops: bool = False, align_clocks: bool = False,
                 clock_offset_ns: int | None = None, align_on_init: bool = True,
                 interval_s: float = 0.05) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.run = run or (self.out_dir.name if self.out_dir is not None else "run")
        if schedule is not None and steps is not None:
            raise ValueError("give either schedule=(wait, warmup, active, repeat) or steps=, not both")
        self.schedule = _check_schedule(schedule) if schedule is not None else None
        self.steps = frozenset(int(s) for s in steps) if steps is not None else None
        self.first_step = int(first_step)
        self.current_step = self.first_step
        self.comm = comm
        self.optimizer_steps = optimizer_steps
        self.dataloader = dataloader
        self.checkpoint = checkpoint
        self.torch_ops = torch_ops
        self.align_clocks = align_clocks and clock_offset_ns is None
        self.clock_offset_ns = int(clock_offset_ns or 0)
        self.align_on_init = align_on_init and clock_offset_ns is None
        self.report: SessionReport | None = None
        self._win_steps: list[int | None] = []    # step of each window (None: not kept), append-only
        self._win_starts: list[int] = []          # its start (ns); appended after its step
        self._sinks = self._build_sinks(store, trace, otel_exporter, otel_processor, sinks)
        self._sink_errors: Counter[str] = Counter()
        self._recorder = EventRecorder(self._to_sinks, interval_s=interval_s,
                                       windows=self._step_windows, domains=domains)
        self._undo: list[Any] = []
        self._torch_prof: Any = None
        self._torch_events: list[dict] = []
        self._counters: list[tuple[int, str, float]] = []
        self._last_step_ns = 0
        self._steps_seen: set[int] = set()
        self._started = False

    # --- public ---------------------------------------------------------------------------
    def start(self) -> "Session":
        """Measure the clock offset (when ``align_clocks``), open the sinks, start recording.

        ``align_clocks=True`` is a collective: every rank must start its session together
        (or measure once with :func:`profiler.clock.measure_offset` and pass
        ``clock_offset_ns=``).
        """
        from profiler.clock import epoch_offset_ns, measure_offset

        if self._started:
            return self
        if self.align_clocks:
            self.clock_offset_ns = measure_offset()
        self._recorder.offset_ns = self.clock_offset_ns
        self.meta = TraceMeta(rank=self.rank, world_size=self.world_size, run=self.run,
                              clock_offset_ns=self.clock_offset_ns,
                              epoch_offset_ns=epoch_offset_ns() - self.clock_offset_ns,
                              thread_names=self._recorder.thread_names)
        self._recorder.start()          # raises first if another session records
        for sink in self._sinks:
            self._guard(sink, "open", self.meta)
        self._started = True
        self._install_builtins()
        self._last_step_ns = time.perf_counter_ns()
        self._enter(self.current_step, self._last_step_ns)
        return self

    def step(self, next_step: int | None = None) -> None:
        """The current step ended; the next one is ``next_step`` (default: current + 1)."""
        if not self._started:
            return
        now = time.perf_counter_ns()
        self._last_step_ns = now
        self.current_step = self.current_step + 1 if next_step is None else int(next_step)
        self._enter(self.current_step, now)

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

    def stop(self) -> SessionReport:
        """Stop recording, flush every sink, and return the :class:`SessionReport`."""
        if not self._started:
            return self.report or SessionReport(self.rank, 0, [], {}, None, self.clock_offset_ns)
        self._started = False
        self._stop_torch_ops()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        problems = self._recorder.stop()
        torch_batch = self._torch_ops_batch() if self._torch_events else None
        for sink in self._sinks:
            if hasattr(sink, "add_raw") and self._torch_events:
                self._guard(sink, "add_raw", self._torch_events)
            elif torch_batch is not None and len(torch_batch):
                self._guard(sink, "write", torch_batch)
            if hasattr(sink, "add_counters") and self._counters:
                self._guard(sink, "add_counters", self._counters)
            self._guard(sink, "close")
        trace_path = next((str(s.path) for s in self._sinks if hasattr(s, "add_raw")), None)
        self.report = SessionReport(
            rank=self.rank, events=self._recorder.events_out,
            steps=sorted(s for s in self._steps_seen if s is not None),
            problems=dict(problems), trace_path=trace_path, clock_offset_ns=self.clock_offset_ns,
            sink_errors=[f"{k} (x{v})" for k, v in self._sink_errors.items()])
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
        if state == ACTIVE:
            self._start_torch_ops()
        else:
            self._stop_torch_ops()

    def _step_windows(self) -> tuple[list[int], list[int | None]]:
        return self._win_starts, self._win_steps

    # --- sinks -----------------------------------------------------------------------------
    def _build_sinks(self, store: Any, trace: bool, otel_exporter: Any, otel_processor: str,
                     extra: Sequence[Any]) -> list[Any]:
        sinks: list[Any] = []
        if store is True and self.out_dir is not None:
            from collectors.store import StoreWriter

            sinks.append(StoreSink(StoreWriter(self.out_dir, rank=self.rank, run=self.run),
                                   own_store=True))
        elif store not in (None, False, True):
            sinks.append(StoreSink(store, own_store=False))
        if trace and self.out_dir is not None:
            from collectors.perfetto import ChromeTraceSink

            sinks.append(ChromeTraceSink(self.out_dir / "trace" / f"rank{self.rank}.json"))
        if otel_exporter is not None:
            from collectors.otel import OTelSink

            sinks.append(OTelSink(otel_exporter, processor=otel_processor))
        sinks.extend(extra)
        return sinks

    def _to_sinks(self, events: EventBatch) -> None:
        self._steps_seen.update(events.step)
        for sink in self._sinks:
            self._guard(sink, "write", events)

    def _guard(self, sink: Any, method: str, *args: Any) -> None:
        try:
            getattr(sink, method)(*args)
        except Exception as e:  # noqa: BLE001 - one failing sink must not stop the others
            self._sink_errors[f"{type(sink).__name__}.{method}: {type(e).__name__}: {e}"[:200]] += 1

    # --- built-in ranges -----------------------------------------------------------------------
    def _install_builtins(self) -> None:
        torch = sys.modules.get("torch")
        if self.comm and torch is not None:
            from engine_adapter import torch_comm

            listener = _CommRanges()
            torch_comm.add_listener(listener)
            self._undo.append(lambda: torch_comm.remove_listener(listener))
        if torch is None:
            return
        if self.optimizer_steps:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            handle = register_optimizer_step_post_hook(self._on_optimizer_step)
            self._undo.append(handle.remove)
        if self.dataloader:
            from torch.utils.data import dataloader as dl

            self._patch(dl._BaseDataLoaderIter, "__next__", "dataloader", "fetch")
        if self.checkpoint:
            self._patch(torch, "save", "checkpoint", "torch.save")
            dcp = sys.modules.get("torch.distributed.checkpoint")
            if dcp is not None and hasattr(dcp, "save"):
                self._patch(dcp, "save", "checkpoint", "torch.distributed.checkpoint.save")
        if self.align_on_init:
            self._align_after_init(torch)

    def _align_after_init(self, torch: Any) -> None:
        """A script that creates its process group after the session started (``probe profile
        -- script`` under torchrun): measure the clock offset right after
        ``init_process_group``, which every rank calls together. Events drained before that
        keep offset 0."""
        import torch.distributed as dist

        if not dist.is_available() or dist.is_initialized():
            return
        from torch.distributed import distributed_c10d as c10d

        orig = c10d.init_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = orig(*args, **kwargs)
            try:
                self._set_offset(dist.get_rank(), dist.get_world_size())
            except Exception as e:  # noqa: BLE001 - no alignment is better than a failed init
                self._sink_errors[f"clock alignment: {type(e).__name__}: {e}"[:200]] += 1
            return result

        init_process_group.__wrapped__ = orig  # type: ignore[attr-defined]
        for owner in (c10d, dist):
            if getattr(owner, "init_process_group", None) is orig:
                setattr(owner, "init_process_group", init_process_group)
                self._undo.append(lambda owner=owner: setattr(owner, "init_process_group", orig))

    def _set_offset(self, rank: int, world_size: int) -> None:
        from profiler.clock import epoch_offset_ns, measure_offset

        offset = measure_offset()
        self.clock_offset_ns = offset
        self._recorder.offset_ns = offset
        self.meta.rank, self.meta.world_size = self.rank, self.world_size = rank, world_size
        self.meta.clock_offset_ns = offset
        self.meta.epoch_offset_ns = epoch_offset_ns() - offset

    def _patch(self, owner: Any, attr: str, domain: str, name: str) -> None:
        orig = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return orig(*args, **kwargs)
            finally:
                emit_complete(name, domain, t0, time.perf_counter_ns())

        timed.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(owner, attr, timed)

        def undo() -> None:
            if getattr(owner, attr, None) is timed:
                setattr(owner, attr, orig)

        self._undo.append(undo)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        now = time.perf_counter_ns()
        emit_complete(f"step {self.current_step}", "step", self._last_step_ns, now,
                      {"step": self.current_step, "source": "optimizer"})
        self.step()

    # --- torch.profiler op-level activity ------------------------------------------------------
    def _start_torch_ops(self) -> None:
        if not self.torch_ops or self._torch_prof is not None:
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._torch_prof = torch.profiler.profile(activities=activities)
        self._torch_prof.__enter__()

    def _stop_torch_ops(self) -> None:
        prof, self._torch_prof = self._torch_prof, None
        if prof is None:
            return
        import json
        import tempfile

        prof.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        finally:
            os.unlink(path)
        self._torch_events.extend(_torch_trace_on_our_clock(data, self.rank, self.meta))


    def _torch_ops_batch(self) -> EventBatch:
        """torch.profiler's ops as event records (domain ``torch.<category>``; device kernels
        have kind ``kernel``), for the sinks other than the trace."""
        import bisect

        kernel_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
        rows = []
        for ev in self._torch_events:
            if ev.get("ph") != "X":
                continue
            start = int(round(ev["ts"] * 1000))
            i = bisect.bisect_right(self._win_starts, start - self.clock_offset_ns) - 1
            step = self._win_steps[i] if i >= 0 else None
            if step is None:
                continue
            cat = str(ev.get("cat", "op"))
            tid_text = str(ev.get("tid", "")).rsplit(" ", 1)[-1]    # "torch <tid>"
            tid = int(tid_text) if tid_text.isdigit() else 0
            rows.append(Event(f"torch.{cat}", str(ev.get("name", "")),
                              "kernel" if cat in kernel_cats else "range", start,
                              start + int(round(float(ev.get("dur", 0)) * 1000)), tid, tid,
                              None, None, None, step))
        self._steps_seen.update(r.step for r in rows)
        return EventBatch.from_events(rows)


def _torch_trace_on_our_clock(data: dict, rank: int, meta: TraceMeta) -> list[dict]:
    """torch.profiler's Chrome events moved onto this session's clock and rank's process."""
    base_us = data.get("baseTimeNanoseconds", 0) / 1000.0
    shift_us = base_us - meta.epoch_offset_ns / 1000.0
    out = []
    for ev in data.get("traceEvents", []):
        if not isinstance(ev, dict) or ev.get("ph") not in ("X", "i", "I"):
            continue
        ev = dict(ev)
        ev["ts"] = float(ev.get("ts", 0)) + shift_us
        ev["pid"] = rank
        ev["tid"] = f"torch {ev.get('tid', 0)}"
        ev.setdefault("cat", "torch")
        out.append(ev)
    out.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    tids = sorted({e["tid"] for e in out})
    for t in tids:
        out.insert(0, {"name": "thread_name", "ph": "M", "pid": rank, "tid": t, "args": {"name": t}})
    return out


class _CommRanges:
    """torch_comm listener: one ``communication`` range per collective/p2p call."""

    def on_comm_end(self, call: Any) -> None:
        emit_complete(call.op, "communication", call.start_ns, call.end_ns, call.payload())


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
    >>> from profiler import mstx
    >>> with profile(tempfile.mkdtemp(), schedule=(0, 1, 1, 1), store=False) as prof:
    ...     for i in range(3):
    ...         mstx.mark(f"step {i}")
    ...         prof.step()
    >>> prof.report.steps, prof.report.events
    ([1], 1)
    """
    return Session(out_dir, schedule=schedule, **kwargs)
