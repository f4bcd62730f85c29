"""The recording stage behind :mod:`profiler.mstx`: per-thread buffers, batching, pairing.

While a :class:`Recorder` runs, each thread that calls ``mstx`` gets its own buffer (registered
once per thread); the hot path only appends one record to it: to C arrays when the
``profiler._mstx_native`` extension is built, else a 5-tuple to a list. A background thread
drains every buffer in batches (no lock needed under the GIL) and turns a batch into columns at
C speed (the extension's bytes, or ``map``/numpy over the tuples): range starts are paired with their ends by id with a sorted
search (ids rise within a thread), and only what crosses batches or threads (an end on another
thread, a range still open) goes through a dict. Device timestamps whose CUDA events have
completed are resolved. Finished events go to the sink as an :class:`EventBatch` (columns;
iterating it yields :class:`Event` rows). Everything is bounded: a buffer that outgrows
``max_buffer`` between two drains loses its excess, and the loss is counted.

Bad input from user code is counted in :attr:`Recorder.problems`, never raised:
``unmatched_end`` (an end whose start was never seen, or a second end), ``unknown_range_id`` (an
id that no ``range_start`` returned), ``unclosed_range`` (started, never ended),
``non_string_message``, ``non_string_domain``, ``huge_message`` (cut to :data:`MAX_MESSAGE`
characters), ``end_domain_differs``, ``dropped_events``.

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
import os
import threading
import time
from collections import Counter
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from profiler import mstx

#: Longest message kept; longer ones are cut and counted as ``huge_message``.
MAX_MESSAGE = 4096

#: Record kind of an event by its domain (everything else is ``range`` or ``mark``).
DOMAIN_KINDS = {"communication": "comm", "step": "step"}


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


class EventBatch:
    """Finished events column by column (lists of equal length, one per :class:`Event` field).

    >>> b = EventBatch.from_events([Event("d", "n", "range", 1, 2, 7, 7, None, None, None, 0)])
    >>> len(b), b.name, [e.end_ns for e in b]
    (1, ['n'], [2])
    """

    __slots__ = Event._fields

    def __init__(self, **columns: list) -> None:
        for f in Event._fields:
            setattr(self, f, columns[f])

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> "EventBatch":
        rows = list(events)
        return cls(**{f: [getattr(e, f) for e in rows] for f in Event._fields})

    def __len__(self) -> int:
        return len(self.start_ns)

    def __iter__(self) -> Iterator[Event]:
        make = tuple.__new__
        return (make(Event, row) for row in zip(*(getattr(self, f) for f in Event._fields)))


def emit_complete(name: str, domain: str, start_ns: int, end_ns: int, payload: dict | None = None) -> None:
    """Record a finished range measured by a built-in wrapper (no pairing needed).

    Does nothing when no session records; used for communication calls, optimizer steps,
    dataloader fetches and checkpoint saves. These go to one list shared by all threads (they
    carry their thread id), drained and bounded like the per-thread buffers.
    """
    if mstx._active:
        mstx._complete.append((start_ns, end_ns, name, domain, payload, threading.get_ident()))


class _Rows:
    """Columns accumulated over one drain, before filtering and step tagging.

    Timestamps and ids are kept as numpy chunks (joined once); a row's kind is derived from its
    domain except for marks, whose row spans are remembered.
    """

    __slots__ = ("domain", "name", "t0", "t1", "rid", "thread", "end_thread", "payload", "marks",
                 "_py")

    def __init__(self) -> None:
        self.domain: list = []
        self.name: list = []
        self.t0: list[np.ndarray] = []
        self.t1: list[np.ndarray] = []
        self.rid: list[np.ndarray] = []
        self.thread: list = []
        self.end_thread: list = []
        self.payload: list = []
        self.marks: list[tuple[int, int]] = []    # [start, end) row spans that are marks
        self._py: list[tuple[int, int, int]] = []  # (t0, t1, rid) of rows added one by one

    def __len__(self) -> int:
        return len(self.domain)

    def add(self, domain: Any, name: Any, t0: int, t1: int, tid: int, end_tid: int, rid: int,
            payload: dict | None) -> None:
        self.domain.append(domain)
        self.name.append(name)
        self.thread.append(tid)
        self.end_thread.append(end_tid)
        self.payload.append(payload)
        self._py.append((t0, t1, rid))

    def extend(self, domain: tuple, name: tuple, t0: np.ndarray, t1: np.ndarray, rid: np.ndarray,
               tid: int, mark: bool = False) -> None:
        self._flush_py()
        n = len(t0)
        if mark:
            self.marks.append((len(self.domain), len(self.domain) + n))
        self.domain.extend(domain)
        self.name.extend(name)
        self.t0.append(t0)
        self.t1.append(t1)
        self.rid.append(rid)
        self.thread.extend([tid] * n)
        self.end_thread.extend([tid] * n)
        self.payload.extend([None] * n)

    def _flush_py(self) -> None:
        if self._py:
            arr = np.array(self._py, dtype=np.int64).reshape(-1, 3)
            self.t0.append(arr[:, 0])
            self.t1.append(arr[:, 1])
            self.rid.append(arr[:, 2])
            self._py = []

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t0, t1, rid) over all rows, in row order."""
        self._flush_py()
        if not self.t0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        return np.concatenate(self.t0), np.concatenate(self.t1), np.concatenate(self.rid)


_CODE, _ID, _TIME, _F3, _F4 = (itemgetter(i) for i in range(5))


def _take(seq: tuple, idx: list[int]) -> tuple:
    if len(idx) > 1:
        return itemgetter(*idx)(seq)
    return (seq[idx[0]],) if idx else ()


def _off_in_child() -> None:
    """A forked child (a DataLoader worker) has no drain thread: it must not buffer forever."""
    mstx._set_state(False, False)
    if mstx._native is not None:
        mstx._native.reset()
    mstx._local = threading.local()
    mstx._new_buffer = list


os.register_at_fork(after_in_child=_off_in_child)


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
        return (dev, ev, int(getattr(stream, "stream_id", 0)))

    def resolve(self, dev_ev: Any, block: bool) -> int | None:
        """Host-clock ns of a recorded device event; None while it has not completed."""
        dev, ev, _ = dev_ev
        if not ev.query():
            if not block:
                return None
            ev.synchronize()
        ref, ref_ns = self.refs[dev]
        return ref_ns + int(ref.elapsed_time(ev) * 1e6)


class Recorder:
    """Switches ``mstx`` on, drains its per-thread buffers in batches and feeds ``sink``.

    ``sink(batch)`` receives :class:`EventBatch` objects. ``windows()`` returns the step windows
    as ``(start_ns list, step list)`` (a step of None drops the events that start in it, e.g. a
    warmup step; events before the first window are dropped); ``offset_ns`` is added to every
    host timestamp (the rank's measured clock offset); ``domains`` keeps only those domains.
    """

    def __init__(self, sink: Callable[[EventBatch], None], *, interval_s: float = 0.05,
                 max_buffer: int = 1_000_000, max_open: int = 1_000_000,
                 windows: Callable[[], tuple[list[int], list[int | None]]] | None = None,
                 offset_ns: int = 0, domains: Iterable[str] | None = None) -> None:
        self.sink = sink
        self.interval_s = interval_s
        self.max_buffer = max_buffer
        self.max_open = max_open
        self.windows = windows
        self.offset_ns = int(offset_ns)
        self.domains = frozenset(domains) if domains is not None else None
        self.problems: Counter[str] = Counter()
        self.events_out = 0
        self.thread_names: dict[int, str] = {}
        self._buffers: list[tuple[int, list, threading.Thread]] = []
        self._reg_lock = threading.Lock()
        self._drain_lock = threading.Lock()
        self._open: dict[int, tuple] = {}          # range id -> (t0, message, domain, thread)
        self._orphan_ends: dict[int, tuple] = {}   # id -> (t1, domain, thread): start not seen yet
        self._pending_device: list[tuple] = []     # (row dict, start event, end event)
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
        mstx._complete = []
        mstx._streams.clear()
        mstx._device_starts.clear()
        mstx._device_ends.clear()
        mstx._device_event = self._device_event
        if mstx._native is not None:
            mstx._native.reset()
            mstx._native.session(self._on_new_thread, self.max_buffer)
        mstx._set_state(True, True)
        self.started = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mstx-drain", daemon=True)
        self._thread.start()
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
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
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
        rows = _Rows()
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
            self._pair(tid, items, rows)
        if mstx._native is not None:
            for tid, codes, ids, ts, f3, f4, dropped in mstx._native.drain():
                if dropped:
                    self.problems["dropped_events"] += dropped
                if f3:
                    self._pair_columns(tid, np.frombuffer(codes, dtype=np.int8),
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
            self._finish()
        return self._finish_rows(rows, final)

    def _pair(self, tid: int, items: list, rows: _Rows) -> None:
        """Pair starts and ends of one thread's batch of record tuples (the Python path)."""
        n = len(items)
        codes = np.fromiter(map(_CODE, items), dtype=np.int8, count=n)
        ts = np.fromiter(map(_TIME, items), dtype=np.int64, count=n)
        self._pair_columns(tid, codes, self._ids(items), ts, list(map(_F3, items)),
                           list(map(_F4, items)), rows)

    def _pair_columns(self, tid: int, codes: np.ndarray, ids: np.ndarray, ts: np.ndarray,
                      f3: list, f4: list, rows: _Rows) -> None:
        """Pair starts and ends of one thread's batch given as columns; marks pass through."""
        s_idx = np.flatnonzero(codes == 1)
        e_idx = np.flatnonzero(codes == 2)
        m_idx = np.flatnonzero(codes == 0)
        if len(m_idx):
            m = m_idx.tolist()
            t = ts[m_idx]
            rows.extend(_take(f4, m), _take(f3, m), t, t, ids[m_idx], tid, mark=True)
        if len(e_idx):
            bad = ids[e_idx] < 0
            if bad.any():
                self.problems["unknown_range_id"] += int(bad.sum())
                e_idx = e_idx[~bad]
        s_ids, e_ids = ids[s_idx], ids[e_idx]
        used = np.zeros(len(s_idx), dtype=bool)
        hit = np.zeros(len(e_idx), dtype=bool)
        if len(s_idx) and len(e_idx):
            pos = np.minimum(np.searchsorted(s_ids, e_ids), len(s_ids) - 1)
            hit = s_ids[pos] == e_ids
            hit_pos = pos[hit]
            used[hit_pos] = True
            if np.count_nonzero(used) < len(hit_pos):   # a range ended twice in this batch
                first = np.unique(hit_pos, return_index=True)[1]
                keep = np.zeros(len(hit_pos), dtype=bool)
                keep[first] = True
                hit[np.flatnonzero(hit)[~keep]] = False
                hit_pos = hit_pos[keep]
            sm, em = s_idx[hit_pos], e_idx[hit]
            if len(sm):
                s_list, e_list = sm.tolist(), em.tolist()
                domains = _take(f4, s_list)
                end_domains = _take(f3, e_list)
                if domains != end_domains:
                    self.problems["end_domain_differs"] += sum(a != b for a, b in zip(domains, end_domains))
                rows.extend(domains, _take(f3, s_list), ts[sm], ts[em], ids[sm], tid)
        opened, orphans = self._open, self._orphan_ends
        for i in s_idx[~used].tolist():                  # still open, or ended on another thread
            rid = int(ids[i])
            end = orphans.pop(rid, None) if orphans else None
            if end is None:
                if len(opened) >= self.max_open:
                    self.problems["unclosed_range"] += 1
                    opened.pop(next(iter(opened)))
                opened[rid] = (int(ts[i]), f3[i], f4[i], tid)
            else:
                rows.add(f4[i], f3[i], int(ts[i]), end[0], tid, end[2], rid, None)
        for i in e_idx[~hit].tolist():                   # started in an earlier batch or thread
            rid = int(ids[i])
            start = opened.pop(rid, None)
            if start is None:
                if rid in orphans:
                    self.problems["unmatched_end"] += 1
                orphans[rid] = (int(ts[i]), f3[i], tid)
                continue
            t0, message, domain, stid = start
            if domain != f3[i]:
                self.problems["end_domain_differs"] += 1
            rows.add(domain, message, t0, int(ts[i]), stid, tid, rid, None)

    def _ids(self, items: list) -> np.ndarray:
        """Range ids as int64; anything that is not an int becomes -1 (an unknown id)."""
        try:
            return np.fromiter(map(_ID, items), dtype=np.int64, count=len(items))
        except (TypeError, ValueError, OverflowError):
            return np.array([i if type(i) is int and 0 <= i < 2**62 else -1 for i in map(_ID, items)],
                            dtype=np.int64)

    def _finish_rows(self, rows: _Rows, final: bool) -> EventBatch | None:
        """Filter, tag steps, check messages, resolve device times; build the batch."""
        n = len(rows)
        if n == 0 and not self._pending_device:
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
            cols = {key: list(_take(v, sel)) for key, v in cols.items()}
            rids = rid[keep]
        if mstx._device_starts or self._pending_device:
            cols = self._with_device_times(cols, rids.tolist(), final)
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

    def _with_device_times(self, cols: dict[str, list], rids: list, final: bool) -> dict[str, list]:
        """Hold back rows with device events until the events complete; add finished ones."""
        starts, ends = mstx._device_starts, mstx._device_ends
        held = [i for i, rid in enumerate(rids) if rid and rid in starts]
        if held:
            for i in held:
                row = {k: v[i] for k, v in cols.items()}
                self._pending_device.append((row, starts.pop(rids[i]), ends.pop(rids[i], None)))
            gone = set(held)
            cols = {k: [x for j, x in enumerate(v) if j not in gone] for k, v in cols.items()}
        still = []
        off = self.offset_ns
        for row, dev0, dev1 in self._pending_device:
            try:
                d0 = self._device.resolve(dev0, final) if dev0 is not None else None
                d1 = self._device.resolve(dev1, final) if dev1 is not None else None
            except Exception:  # noqa: BLE001 - a failed device event loses its device times only
                self.problems["device_timestamp_failed"] += 1
                d0 = d1 = None
                dev0 = dev1 = None
            if (dev0 is not None and d0 is None) or (dev1 is not None and d1 is None):
                if final:
                    self.problems["device_timestamp_failed"] += 1
                else:
                    still.append((row, dev0, dev1))
                    continue
            row["device_start_ns"] = d0 + off if d0 is not None else None
            row["device_end_ns"] = d1 + off if d1 is not None else None
            if dev0 is not None:
                row["payload"] = {**(row["payload"] or {}), "device": dev0[0], "stream": dev0[2]}
            for k, v in cols.items():
                v.append(row[k])
        self._pending_device = still
        return cols

    def _finish(self) -> None:
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
