"""The recording stage behind :mod:`profiler.mstx`: per-thread buffers, batching, pairing.

While a :class:`Recorder` runs, each thread that calls ``mstx`` gets its own list (registered
once per thread); the hot path only appends a tuple to it. A background thread drains every
buffer in batches (``len`` then slice then ``del``, which needs no lock under the GIL), pairs
range starts with range ends by id (across threads and across batches), resolves device
timestamps whose CUDA events have completed, and passes finished :class:`Event` lists to the
sinks. Everything here is bounded: a buffer that outgrows ``max_buffer`` between two drains
loses its excess, and the loss is counted in :attr:`Recorder.problems`.

Bad input from user code is counted here, never raised: ``unmatched_end`` (an end whose start was
never seen), ``unknown_range_id`` (an id that no ``range_start`` returned), ``unclosed_range``
(started, never ended), ``non_string_message``, ``huge_message`` (cut to
:data:`MAX_MESSAGE` characters), ``dropped_events``.

>>> from profiler import mstx
>>> got = []
>>> rec = Recorder(sink=got.extend).start()
>>> rid = mstx.range_start("work", domain="engine"); mstx.range_end(rid, domain="engine")
>>> report = rec.stop()
>>> [(e.domain, e.name, e.kind) for e in got]
[('engine', 'work', 'range')]
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterable, NamedTuple

from profiler import mstx

#: Longest message kept; longer ones are cut and counted as ``huge_message``.
MAX_MESSAGE = 4096

#: Record kind of an event by its domain (everything else is ``range`` or ``mark``).
DOMAIN_KINDS = {"communication": "comm", "step": "step"}

COMPLETE = 3   # raw tuple code: (3, 0, start_ns, name, domain, end_ns, payload) from built-in wrappers


class Event(NamedTuple):
    """One finished event, timestamps in ns on the session's (aligned) host clock."""

    domain: str
    name: str
    kind: str                 # mark | range | comm | step | kernel
    start_ns: int
    end_ns: int               # == start_ns for a mark
    thread: int               # thread that started it
    end_thread: int           # thread that ended it (differs for cross-thread ranges)
    device_start_ns: int | None
    device_end_ns: int | None
    payload: dict | None
    step: int | None


def emit_complete(name: str, domain: str, start_ns: int, end_ns: int, payload: dict | None = None) -> None:
    """Record a finished range measured by a built-in wrapper (no pairing needed).

    Does nothing when no session records; used for communication calls, optimizer steps,
    dataloader fetches and checkpoint saves.
    """
    if mstx._active:
        try:
            push = mstx._local.push
        except AttributeError:
            push = mstx._register()
        push((COMPLETE, 0, start_ns, name, domain, end_ns, payload))


class _DeviceClock:
    """Maps CUDA timing events to host ns: a reference event is taken at start on each device."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.refs: dict[int, tuple[Any, int]] = {}

    def event(self, stream: Any) -> Any:
        dev = stream.device.index if stream.device.index is not None else 0
        if dev not in self.refs:
            self.torch.cuda.synchronize(dev)
            ref = self.torch.cuda.Event(enable_timing=True)
            ref.record(self.torch.cuda.default_stream(dev))
            self.torch.cuda.synchronize(dev)
            self.refs[dev] = (ref, time.perf_counter_ns())
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return (dev, ev)

    def resolve(self, dev_ev: Any, block: bool) -> int | None:
        """Host-clock ns of a recorded device event; None while it has not completed."""
        dev, ev = dev_ev
        if not ev.query():
            if not block:
                return None
            ev.synchronize()
        ref, ref_ns = self.refs[dev]
        return ref_ns + int(ref.elapsed_time(ev) * 1e6)


class Recorder:
    """Switches ``mstx`` on, drains its per-thread buffers in batches and feeds ``sink``.

    ``sink(events)`` receives lists of :class:`Event`; ``classify(start_ns)`` returns the step
    an event belongs to, or ``None`` to drop it (a warmup step), and ``latest_window()`` the
    (start_ns, step or None) of the newest step window (a fast path for ``classify``); ``offset_ns`` is added to every
    host timestamp (the rank's measured clock offset); ``domains`` keeps only those domains.
    """

    def __init__(self, sink: Callable[[list[Event]], None], *, interval_s: float = 0.05,
                 max_buffer: int = 1_000_000, max_open: int = 1_000_000,
                 classify: Callable[[int], int | None] | None = None,
                 latest_window: Callable[[], tuple[int, int | None]] | None = None, offset_ns: int = 0,
                 domains: Iterable[str] | None = None) -> None:
        self.sink = sink
        self.interval_s = interval_s
        self.max_buffer = max_buffer
        self.max_open = max_open
        self.classify = classify
        self.latest_window = latest_window
        self.offset_ns = int(offset_ns)
        self.domains = frozenset(domains) if domains is not None else None
        self.problems: Counter[str] = Counter()
        self.events_out = 0
        self._buffers: list[tuple[int, list, threading.Thread]] = []
        self.thread_names: dict[int, str] = {}
        self._reg_lock = threading.Lock()
        self._drain_lock = threading.Lock()
        self._open: dict[int, tuple] = {}          # range id -> (t, message, domain, thread, dev)
        self._orphan_ends: dict[int, tuple] = {}   # ends seen before their start (other thread's batch)
        self._pending_device: list[tuple] = []     # events waiting for device timestamps
        self._first_id = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._device: _DeviceClock | None = None
        self.started = False

    # --- switching ----------------------------------------------------------------------
    def start(self) -> "Recorder":
        """Make ``mstx`` record into this recorder and start the draining thread."""
        if mstx._active or mstx._ends:
            raise RuntimeError("another profiling session is already recording in this process; "
                               "stop it before starting a new one")
        self._first_id = mstx._next_id()
        mstx._local = threading.local()
        mstx._new_buffer = self._new_buffer
        mstx._streams.clear()
        mstx._device_event = self._device_event
        mstx._ends = True
        mstx._active = True
        self.started = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mstx-drain", daemon=True)
        self._thread.start()
        return self

    def pause(self) -> None:
        """Stop recording new marks and starts; ends of open ranges are still recorded."""
        mstx._active = False

    def resume(self) -> None:
        """Record marks and starts again after :meth:`pause`."""
        if self.started:
            mstx._active = True

    def stop(self) -> Counter:
        """Switch ``mstx`` off, drain what is left, count unclosed ranges; return the problems."""
        if not self.started:
            return self.problems
        mstx._active = False
        mstx._ends = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.drain(final=True)
        mstx._device_event = None
        mstx._new_buffer = list
        mstx._local = threading.local()
        self.started = False
        return self.problems

    # --- hot-path helpers -----------------------------------------------------------------
    def _new_buffer(self) -> list:
        buf: list = []
        ident = threading.get_ident()
        with self._reg_lock:
            self._buffers.append((ident, buf, threading.current_thread()))
            self.thread_names[ident] = threading.current_thread().name
        return buf

    def _device_event(self, stream: Any) -> Any:
        if self._device is None:
            self._device = _DeviceClock()
        return self._device.event(stream)

    # --- the batching stage -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.drain()
            except Exception as e:  # noqa: BLE001 - a sink failure must not kill recording
                self.problems[f"sink_error: {type(e).__name__}: {e}"[:200]] += 1

    def drain(self, final: bool = False) -> int:
        """Move everything buffered so far to the sink; return the number of events passed on."""
        with self._drain_lock:
            # a batch allocates many small tuples; a collection of the (large) training heap in
            # the middle of it would cost more than the batch itself, so collect after it
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                out = self._collect(final)
            finally:
                if gc_was_on:
                    gc.enable()
            if out:
                self.events_out += len(out)
                self.sink(out)
            return len(out)

    def _collect(self, final: bool) -> list[Event]:
        with self._reg_lock:
            buffers = list(self._buffers)
        out: list[Event] = []
        for entry in buffers:
            tid, buf, thread = entry
            n = len(buf)
            if not n:
                if not thread.is_alive():          # a finished thread: forget its buffer
                    with self._reg_lock:
                        self._buffers.remove(entry)
                continue
            items = buf[:n]
            del buf[:n]
            if n > self.max_buffer:
                self.problems["dropped_events"] += n - self.max_buffer
                items = items[:self.max_buffer]
            self._process(tid, items, out)
        if self._pending_device:
            self._resolve_device(out, block=final)
        if final:
            self._finish(out)
        out.sort(key=_start_of)
        return out

    def _process(self, tid: int, items: list, out: list[Event]) -> None:
        """Pair starts with ends, then turn the finished records into events (two tight loops)."""
        opened = self._open
        orphans = self._orphan_ends
        done: list[tuple] = []     # (domain, message, kind, t0, t1, tid, end_tid, dev0, dev1, payload)
        add = done.append
        for it in items:
            code = it[0]
            if code == 1:
                rid = it[1]
                if orphans and rid in orphans:
                    t1, end_domain, end_tid, dev1 = orphans.pop(rid)
                    add((it[4], it[3], None, it[2], t1, tid, end_tid,
                         it[5] if len(it) > 5 else None, dev1, None))
                    continue
                if len(opened) >= self.max_open:
                    self.problems["unclosed_range"] += 1
                    opened.pop(next(iter(opened)))
                opened[rid] = (it, tid)
            elif code == 2:
                rid = it[1]
                if type(rid) is not int:     # not an id range_start returned
                    self.problems["unknown_range_id"] += 1
                    continue
                start = opened.pop(rid, None)
                if start is None:
                    orphans[rid] = (it[2], it[3], tid, it[4] if len(it) > 4 else None)
                    continue
                st, stid = start
                if st[4] != it[3]:
                    self.problems["end_domain_differs"] += 1
                add((st[4], st[3], None, st[2], it[2], stid, tid,
                     st[5] if len(st) > 5 else None, it[4] if len(it) > 4 else None, None))
            elif code == 0:
                dev = it[5] if len(it) > 5 else None
                add((it[4], it[3], "mark", it[2], it[2], tid, tid, dev, dev, None))
            else:  # COMPLETE from a built-in wrapper
                add((it[4], it[3], None, it[2], it[5], tid, tid, None, None, it[6]))
        if done:
            self._finish_events(done, out)

    def _finish_events(self, done: list[tuple], out: list[Event]) -> None:
        new = tuple.__new__
        off = self.offset_ns
        keep_domains = self.domains
        classify = self.classify
        kinds = DOMAIN_KINDS
        add = out.append
        # fast path for the step classification: most events start in the latest window
        last_start, last_step = self._latest_window()
        for domain, message, kind, t0, t1, tid, end_tid, dev0, dev1, payload in done:
            if type(domain) is not str:
                domain = self._text(domain, "non_string_domain")
            if keep_domains is not None and domain not in keep_domains:
                continue
            if classify is None:
                step = None
            elif last_start is not None and t0 >= last_start:
                step = last_step
                if step is None:
                    continue
            else:
                step = classify(t0)
                if step is None:
                    continue
            if type(message) is not str:
                message = self._text(message, "non_string_message")
            if len(message) > MAX_MESSAGE:
                self.problems["huge_message"] += 1
                message = message[:MAX_MESSAGE] + "..."
            if kind is None:
                kind = kinds.get(domain, "range")
            ev = new(Event, (domain, message, kind, t0 + off, t1 + off, tid, end_tid, None, None,
                             payload, step))
            if dev0 is not None and dev1 is not None:
                self._pending_device.append((ev, dev0, dev1))
            else:
                add(ev)

    def _latest_window(self) -> tuple[int | None, int | None]:
        """(start_ns, step or None when dropped) of the newest window, from ``latest_window``."""
        latest = self.latest_window
        return latest() if latest is not None else (None, None)

    def _text(self, value: Any, problem: str) -> str:
        self.problems[problem] += 1
        try:
            return str(value)
        except Exception:  # noqa: BLE001 - a __str__ that raises
            return f"<unprintable {type(value).__name__}>"

    def _resolve_device(self, out: list[Event], block: bool) -> None:
        still = []
        off = self.offset_ns
        for ev, dev0, dev1 in self._pending_device:
            try:
                d0 = self._device.resolve(dev0, block)
                d1 = self._device.resolve(dev1, block) if d0 is not None else None
            except Exception:  # noqa: BLE001 - a failed device event loses its device times only
                self.problems["device_timestamp_failed"] += 1
                out.append(ev)
                continue
            if d0 is None or d1 is None:
                still.append((ev, dev0, dev1))
            else:
                out.append(ev._replace(device_start_ns=d0 + off, device_end_ns=d1 + off))
        self._pending_device = still

    def _finish(self, out: list[Event]) -> None:
        """Session end: count what never balanced."""
        if self._open:
            self.problems["unclosed_range"] += len(self._open)
            self._open.clear()
        last_id = mstx._next_id()
        for rid in self._orphan_ends:
            if self._first_id < rid < last_id:
                self.problems["unmatched_end"] += 1
            else:
                self.problems["unknown_range_id"] += 1
        self._orphan_ends.clear()


def _start_of(ev: Event) -> int:
    return ev.start_ns


def payload_json(payload: dict | None) -> str | None:
    """The JSON text stored for an event's payload (None stays None)."""
    if payload is None:
        return None
    return json.dumps(payload, default=str, separators=(",", ":"))


def describe_problems(problems: Counter) -> str:
    """One line that says what went wrong with the recorded input, or '' when nothing did.

    >>> describe_problems(Counter({"unclosed_range": 2, "unmatched_end": 1}))
    'unclosed_range: 2, unmatched_end: 1'
    """
    return ", ".join(f"{k}: {v}" for k, v in sorted(problems.items()) if v)
