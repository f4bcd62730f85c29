"""The recording stage behind :mod:`profiler.mstx`: per-thread buffers drained into event batches.

While an :class:`EventRecorder` runs, each thread that calls ``mstx`` gets its own buffer
(registered once per thread); the hot path only appends one record to it: to C arrays when the
``profiler._mstx_native`` extension is built, else a 5-tuple to a list. A background worker (a
:class:`ground.background.BackgroundQueue` woken every ``interval_s``) drains every buffer in
batches (no lock needed under the GIL) and turns a batch into columns at C speed (the
extension's bytes, or ``map``/numpy over the tuples); :mod:`profiler.range_pairing` pairs range
starts with their ends; :mod:`profiler.device_times` adds device timestamps whose CUDA events
have completed. Finished events go to the sink as an :class:`~profiler.events.EventBatch`
(columns; iterating it yields :class:`~profiler.events.Event` rows). Everything is bounded: a
buffer that outgrows ``max_buffer`` between two drains loses its excess, and the loss is counted.

Bad input from user code is counted in :attr:`EventRecorder.problems`, never raised:
``unmatched_end`` (an end whose start was never seen, or a second end), ``unknown_range_id`` (an
id that no ``range_start`` returned), ``unclosed_range`` (started, never ended),
``non_string_message``, ``non_string_domain``, ``huge_message`` (cut to :data:`MAX_MESSAGE`
characters), ``end_domain_differs``, ``dropped_events``.

>>> from profiler import mstx
>>> got = []
>>> rec = EventRecorder(sink=got.extend).start()
>>> rid = mstx.range_start("work", domain="engine"); mstx.range_end(rid, domain="engine")
>>> report = rec.stop()
>>> [(e.domain, e.name, e.kind) for e in got]
[('engine', 'work', 'range')]
"""

from __future__ import annotations

import gc
import os
import threading
from collections import Counter
from itertools import repeat
from typing import Any, Callable, Iterable

import numpy as np

from ground.background import BackgroundQueue
from profiler import mstx
from profiler.device_times import DeviceTimes
from profiler.events import DOMAIN_KINDS, EventBatch
from profiler.range_pairing import RangePairer, Rows, take

#: Longest message kept; longer ones are cut and counted as ``huge_message``.
MAX_MESSAGE = 4096


def _off_in_child() -> None:
    """A forked child (a DataLoader worker) has no drain thread: it must not buffer forever."""
    mstx._set_state(False, False)
    if mstx._native is not None:
        mstx._native.reset()
    mstx._local = threading.local()
    mstx._new_buffer = list


os.register_at_fork(after_in_child=_off_in_child)


class EventRecorder:
    """Switches ``mstx`` on, drains its per-thread buffers in batches and feeds ``sink``.

    ``sink(batch)`` receives :class:`~profiler.events.EventBatch` objects. ``windows()``
    returns the step windows as ``(start_ns list, step list)`` (a step of None drops the events
    that start in it, e.g. a warmup step; events before the first window are dropped);
    ``offset_ns`` is added to every host timestamp (the rank's measured clock offset);
    ``domains`` keeps only those domains.
    """

    def __init__(self, sink: Callable[[EventBatch], None], *, interval_s: float = 0.05,
                 max_buffer: int = 1_000_000, max_open: int = 1_000_000,
                 windows: Callable[[], tuple[list[int], list[int | None]]] | None = None,
                 offset_ns: int = 0, domains: Iterable[str] | None = None) -> None:
        self.sink = sink
        self.interval_s = interval_s
        self.max_buffer = max_buffer
        self.windows = windows
        self.offset_ns = int(offset_ns)
        self.domains = frozenset(domains) if domains is not None else None
        self.problems: Counter[str] = Counter()
        self.pairer = RangePairer(self.problems, max_open)
        self.device = DeviceTimes(self.problems)
        self.events_out = 0
        self.thread_names: dict[int, str] = {}
        self._buffers: list[tuple[int, list, threading.Thread]] = []
        self._reg_lock = threading.Lock()
        self._drain_lock = threading.Lock()
        self._first_id = 0
        self._worker: BackgroundQueue | None = None
        self.started = False

    # --- switching ----------------------------------------------------------------------
    def start(self) -> "EventRecorder":
        """Make ``mstx`` record into this recorder and start the draining worker."""
        if mstx._active or mstx._ends:
            raise RuntimeError("another profiling session is already recording in this process; "
                               "stop it before starting a new one")
        self._first_id = mstx._next_id()
        mstx._local = threading.local()
        mstx._new_buffer = self._new_buffer
        mstx._complete = []
        mstx._streams.clear()
        mstx._device_starts.clear()
        mstx._device_ends.clear()
        mstx._device_event = self.device.event
        if mstx._native is not None:
            mstx._native.reset()
            mstx._native.session(self._on_new_thread, self.max_buffer)
        mstx._set_state(True, True)
        self.started = True
        self._worker = BackgroundQueue(self._drain_on_interval, name="mstx-drain",
                                       interval_s=self.interval_s, on_error=self._count_sink_error)
        return self

    def pause(self) -> None:
        """Stop recording new marks and starts; ends of open ranges are still recorded."""
        mstx._set_state(False, mstx._ends)

    def resume(self) -> None:
        """Record marks and starts again after :meth:`pause`."""
        if self.started:
            mstx._set_state(True, True)

    def stop(self) -> Counter:
        """Switch ``mstx`` off, drain what is left, count unclosed ranges; return the problems."""
        if not self.started:
            return self.problems
        mstx._set_state(False, False)
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        self.drain(final=True)
        if mstx._native is not None:
            mstx._native.reset()
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

    def _on_new_thread(self) -> None:
        """Run by the C path on a thread's first record: remember the thread's name."""
        thread = threading.current_thread()
        self.thread_names[thread.ident] = thread.name

    # --- the batching stage -----------------------------------------------------------------
    def _drain_on_interval(self, _nothing_queued: list) -> None:
        """The worker's heartbeat: the buffers live with the threads, not in its queue."""
        self.drain()

    def _count_sink_error(self, e: BaseException) -> None:
        """A failing sink must not kill recording: count it and go on."""
        self.problems[f"sink_error: {type(e).__name__}: {e}"[:200]] += 1

    def drain(self, final: bool = False) -> int:
        """Move everything buffered so far to the sink; return the number of events passed on."""
        with self._drain_lock:
            # a batch allocates many small objects; a collection of the (large) training heap in
            # the middle of it would cost more than the batch itself, so collect after it
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                batch = self._collect(final)
            finally:
                if gc_was_on:
                    gc.enable()
            if batch is not None and len(batch):
                self.events_out += len(batch)
                self.sink(batch)
                return len(batch)
            return 0

    def _collect(self, final: bool) -> EventBatch | None:
        with self._reg_lock:
            buffers = list(self._buffers)
        rows = Rows()
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
            self.pairer.pair(tid, items, rows)
        if mstx._native is not None:
            for tid, codes, ids, ts, f3, f4, dropped in mstx._native.drain():
                if dropped:
                    self.problems["dropped_events"] += dropped
                if f3:
                    self.pairer.pair_columns(tid, np.frombuffer(codes, dtype=np.int8),
                                             np.frombuffer(ids, dtype=np.int64),
                                             np.frombuffer(ts, dtype=np.int64), f3, f4, rows)
        complete = mstx._complete
        n = len(complete)
        if n:
            items = complete[:n]
            del complete[:n]
            if n > self.max_buffer:
                self.problems["dropped_events"] += n - self.max_buffer
                items = items[:self.max_buffer]
            for t0, t1, name, domain, payload, tid in items:
                rows.add(domain, name, t0, t1, tid, tid, 0, payload)
        if final:
            self.pairer.finish(self._first_id, mstx._next_id())
        return self._finish_rows(rows, final)

    def _finish_rows(self, rows: Rows, final: bool) -> EventBatch | None:
        """Filter, tag steps, check messages, resolve device times; build the batch."""
        n = len(rows)
        if n == 0 and not self.device.pending:
            return None
        t0, t1, rid = rows.columns()
        keep = np.ones(n, dtype=bool)
        domains = rows.domain
        if set(map(type, domains)) - {str}:
            domains = [d if type(d) is str else self._text(d, "non_string_domain") for d in domains]
        if self.domains is not None:
            keep &= np.fromiter(map(self.domains.__contains__, domains), dtype=bool, count=n)
        steps: list = [None] * n
        if self.windows is not None:
            starts, window_steps = self.windows()
            k = len(starts)
            idx = np.searchsorted(np.asarray(starts[:k], dtype=np.int64), t0, side="right") - 1
            lookup = np.array([-1 if st is None else st for st in window_steps[:k]] + [-1], dtype=np.int64)
            step_arr = lookup[idx]                  # idx -1 (before the first window) -> the -1 at the end
            keep &= step_arr >= 0
            steps = step_arr.tolist()
        names = rows.name
        if set(map(type, names)) - {str}:
            names = [m if type(m) is str else self._text(m, "non_string_message") for m in names]
        if names and max(map(len, names)) > MAX_MESSAGE:
            names = [self._cut(m) for m in names]
        kinds = list(map(DOMAIN_KINDS.get, domains, repeat("range", n)))
        for a, b in rows.marks:
            kinds[a:b] = ["mark"] * (b - a)
        off = self.offset_ns
        cols = {"domain": domains, "name": names, "kind": kinds,
                "start_ns": (t0 + off).tolist(), "end_ns": (t1 + off).tolist(),
                "thread": rows.thread, "end_thread": rows.end_thread,
                "device_start_ns": [None] * n, "device_end_ns": [None] * n,
                "payload": rows.payload, "step": steps}
        rids = rid
        if not keep.all():
            sel = np.flatnonzero(keep).tolist()
            cols = {key: list(take(v, sel)) for key, v in cols.items()}
            rids = rid[keep]
        if mstx._device_starts or self.device.pending:
            cols = self.device.add(cols, rids.tolist(), self.offset_ns, final)
        return EventBatch(**cols)

    def _cut(self, message: str) -> str:
        if len(message) <= MAX_MESSAGE:
            return message
        self.problems["huge_message"] += 1
        return message[:MAX_MESSAGE] + "..."

    def _text(self, value: Any, problem: str) -> str:
        self.problems[problem] += 1
        try:
            return str(value)
        except Exception:  # noqa: BLE001 - a __str__ that raises
            return f"<unprintable {type(value).__name__}>"
