"""The recording stage behind :mod:`probe.profiler.mstx`: per-thread buffers drained into event batches.

While an :class:`EventRecorder` runs, each thread that calls ``mstx`` gets its own buffer
(registered once per thread); the hot path only appends one record to it: to C arrays when the
``profiler._mstx_native`` extension is built, else a 5-tuple to a list. A background worker (a
:class:`probe.ground.background.BackgroundQueue` woken every ``interval_s``) drains every buffer in
batches (no lock needed under the GIL) and turns a batch into columns at C speed (the
extension's bytes, or ``map``/numpy over the tuples); :mod:`probe.profiler.range_pairing` pairs range
starts with their ends; :mod:`probe.profiler.device_times` adds device timestamps whose CUDA events
have completed. Finished events go to the sink as an :class:`~probe.profiler.events.EventBatch`
(columns; iterating it yields :class:`~probe.profiler.events.Event` rows).

Every buffer is bounded by ``max_buffer`` records between two drains; what a full buffer does is
``overflow``, in the words of :mod:`probe.ground.background`:

- ``"block"`` (the default): nothing is lost. The C path wakes the drain and the recording
  thread waits, the GIL released, until the drain has taken its buffer; the pure-Python path
  cannot check the bound on each call without slowing it, so the drain checks it: a thread whose
  buffer outgrew the bound waits on its next ``mstx`` call until that drain is done. A training
  loop records far below the rate the drain keeps up with (docs/profile.md gives both rates),
  so it never waits; a tight loop of ``mstx`` calls runs at the drain's pace. The waits are
  counted (:attr:`EventRecorder.waits`, :attr:`EventRecorder.wait_ns`).
- ``"spool"``: nothing is lost and nobody waits: the full buffer is written to disk
  (:class:`probe.profiler.spool.Spool`; by the recording thread on the C path, by the drain on the
  pure-Python path) and the drain reads it back, oldest first (:attr:`EventRecorder.spilled`).
- ``"drop"``: the records past the bound are dropped and counted as ``dropped_records``.

Bad input from user code is counted in :attr:`EventRecorder.problems`, never raised:
``unmatched_end`` (an end whose start was never seen, or a second end), ``unknown_range_id`` (an
id that no ``range_start`` returned), ``unclosed_range`` (started, never ended),
``non_string_message``, ``non_string_domain``, ``huge_message`` (cut to :data:`MAX_MESSAGE`
characters), ``end_domain_differs``; and the recording's own loss, ``dropped_records`` (only under
``overflow="drop"``, or when a thread is full while no drain can run: the drain's own thread).

>>> from probe.profiler import mstx
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
import time
from collections import Counter
from itertools import repeat
from typing import Any, Callable, Iterable

import numpy as np

from probe.ground.background import OVERFLOW_POLICIES, BackgroundQueue
from probe.profiler import mstx
from probe.profiler.device_times import DeviceTimes
from probe.profiler.events import DOMAIN_KINDS, EventBatch
from probe.profiler.range_pairing import RangePairer, Rows, take
from probe.profiler.spool import Spool

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

    ``sink(batch)`` receives :class:`~probe.profiler.events.EventBatch` objects. ``windows()``
    returns the step windows as ``(start_ns list, step list)`` (a step of None drops the events
    that start in it, e.g. a warmup step; events before the first window are dropped);
    ``offset_ns`` is added to every host timestamp (the rank's measured clock offset);
    ``domains`` keeps only those domains; ``max_buffer`` bounds each thread's buffer and
    ``overflow`` (``block``, ``spool`` or ``drop``) says what a full one does (see the module
    docstring); ``spool_dir``: where ``spool`` writes (default: the system's temporary folder).
    """

    def __init__(self, sink: Callable[[EventBatch], None], *, interval_s: float = 0.05,
                 max_buffer: int = 1_000_000, max_open: int = 1_000_000,
                 windows: Callable[[], tuple[list[int], list[int | None]]] | None = None,
                 offset_ns: int = 0, domains: Iterable[str] | None = None,
                 overflow: str = "block", spool_dir: str | os.PathLike | None = None) -> None:
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow {overflow!r}: use one of {', '.join(OVERFLOW_POLICIES)}")
        if max_buffer < 1:
            raise ValueError(f"max_buffer {max_buffer}: use 1 or more")
        self.sink = sink
        self.interval_s = interval_s
        self.max_buffer = max_buffer
        self.overflow = overflow
        self.spool = Spool(spool_dir) if overflow == "spool" else None
        self.waits = 0                   # times a recording thread waited for the drain
        self.wait_ns = 0                 # and for how long in all
        self.spilled = 0                 # records written to the spool
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
        self._drainer = 0                # the thread draining now: it must never wait for itself
        self._held: set[int] = set()     # Python path: threads to wait until this drain is done
        self._drained = threading.Condition()
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
        self._worker = BackgroundQueue(self._drain_on_interval, name="mstx-drain",
                                       interval_s=self.interval_s, on_error=self._count_sink_error)
        if mstx._native is not None:
            mstx._native.reset()
            on_full = {"block": self._wake_drain, "spool": self._spill, "drop": None}[self.overflow]
            mstx._native.session(self._on_new_thread, self.max_buffer, self.overflow, on_full)
        mstx._set_state(True, True)
        self.started = True
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
            waits, wait_ns = mstx._native.stats()
            self.waits += waits
            self.wait_ns += wait_ns
            mstx._native.reset()
        if self.spool is not None:
            self.spilled = self.spool.records
            self.spool.close()
        mstx._device_event = None
        mstx._new_buffer = list
        mstx._local = threading.local()
        self.started = False
        with self._drained:
            self._held.clear()
            self._drained.notify_all()
        return self.problems

    # --- hot-path helpers -----------------------------------------------------------------
    def _new_buffer(self) -> list:
        """A thread's buffer, on its first record; or its own again when the drain replaced
        ``mstx._local`` to stop it (Python path, ``block``): then it waits for that drain."""
        ident = threading.get_ident()
        me = threading.current_thread()
        with self._reg_lock:
            mine = next((buf for tid, buf, thread in self._buffers if thread is me), None)
            if mine is None:
                mine = []
                self._buffers.append((ident, mine, me))
                self.thread_names[ident] = me.name
        if ident in self._held:
            t0 = time.perf_counter_ns()
            with self._drained:
                while ident in self._held:
                    self._drained.wait(0.5)
            self.waits += 1
            self.wait_ns += time.perf_counter_ns() - t0
        return mine

    def _on_new_thread(self) -> None:
        """Run by the C path on a thread's first record: remember the thread's name."""
        thread = threading.current_thread()
        self.thread_names[thread.ident] = thread.name

    def _wake_drain(self) -> bool:
        """Run by the C path when a buffer is full (``block``): wake the drain; False when no
        drain will come for this thread, which then drops the record and counts it."""
        worker = self._worker
        if worker is None or threading.get_ident() == self._drainer:
            return False
        worker.wake()                    # the worker drains now, not at its next tick
        return True                      # (closing: stop() drains what is left itself)

    def _spill(self, chunk: tuple) -> None:
        """Run by the C path when a buffer is full (``spool``): the buffer goes to disk."""
        self.spool.write(chunk)

    # --- the batching stage -----------------------------------------------------------------
    def _drain_on_interval(self, _nothing_queued: list) -> None:
        """The worker's heartbeat (or a full buffer's wake-up): the buffers live with the
        threads, not in its queue."""
        self.drain()

    def _count_sink_error(self, e: BaseException) -> None:
        """A failing sink must not kill recording: count it and go on."""
        self.problems[f"sink_error: {type(e).__name__}: {e}"[:200]] += 1

    def drain(self, final: bool = False) -> int:
        """Move everything buffered so far to the sink; return the number of events passed on.

        Spooled chunks go first, one batch each, oldest first; then what the buffers hold (and
        what the pure-Python path spooled from them just now). ``final``: the session ends; what
        never balanced is counted, and rows waiting for device events wait no more.
        """
        with self._drain_lock:
            self._drainer = threading.get_ident()
            try:
                out = self._pass_on_spooled()
                out += self._pass_on(self._collect)
                out += self._pass_on_spooled()
                if final:
                    self.pairer.finish(self._first_id, mstx._next_id())
                    out += self._pass_on(lambda: self._finish_rows(Rows(), final=True))
                return out
            finally:
                self._drainer = 0
                if self._held:
                    with self._drained:
                        self._held.clear()
                        self._drained.notify_all()

    def _pass_on_spooled(self) -> int:
        out = 0
        while self.spool is not None and len(self.spool):
            out += self._pass_on(self._collect_spooled)
        return out

    def _pass_on(self, collect: Callable[[], EventBatch | None]) -> int:
        # a batch allocates many small objects; a collection of the (large) training heap in
        # the middle of it would cost more than the batch itself, so collect after it
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            batch = collect()
        finally:
            if gc_was_on:
                gc.enable()
        if batch is not None and len(batch):
            self.events_out += len(batch)
            self.sink(batch)
            return len(batch)
        return 0

    def _collect_spooled(self) -> EventBatch | None:
        chunk = self.spool.take()
        if chunk is None:
            return None
        rows = Rows()
        if len(chunk) == 2:                         # the Python path's (thread id, records)
            self.pairer.pair(chunk[0], chunk[1], rows)
        else:
            self._pair_native(chunk, rows)
        return self._finish_rows(rows, final=False)

    def _pair_native(self, chunk: tuple, rows: Rows) -> None:
        tid, codes, ids, ts, f3, f4, dropped = chunk
        if dropped:
            self.problems["dropped_records"] += dropped
        if f3:
            self.pairer.pair_columns(tid, np.frombuffer(codes, dtype=np.int8),
                                     np.frombuffer(ids, dtype=np.int64),
                                     np.frombuffer(ts, dtype=np.int64), f3, f4, rows)

    def _collect(self) -> EventBatch | None:
        # the C buffers first: a thread waiting for room (block) waits for this
        native = mstx._native.drain() if mstx._native is not None else ()
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
                items = self._over_bound(tid, items)
            self.pairer.pair(tid, items, rows)
        for chunk in native:
            self._pair_native(chunk, rows)
        complete = mstx._complete
        n = len(complete)
        if n:
            items = complete[:n]
            del complete[:n]
            if n > self.max_buffer and self.overflow == "drop":
                self.problems["dropped_records"] += n - self.max_buffer
                items = items[:self.max_buffer]
            for t0, t1, name, domain, payload, tid in items:
                rows.add(domain, name, t0, t1, tid, tid, 0, payload)
        return self._finish_rows(rows, final=False)

    def _over_bound(self, tid: int, items: list) -> list:
        """A Python-path buffer that outgrew ``max_buffer`` since the last drain: the records
        of this batch, after the overflow policy had its say."""
        keep = self.max_buffer
        if self.overflow == "drop":
            self.problems["dropped_records"] += len(items) - keep
        elif self.overflow == "spool":
            self.spool.write((tid, items[keep:]))
        else:                                       # block: the thread waits for this drain
            if tid != threading.get_ident():        # ... unless it is the one draining
                self._held.add(tid)
                mstx._local = threading.local()     # ... on its next call (it registers again)
            return items
        return items[:keep]

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
