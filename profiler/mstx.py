"""``mstx``: marks and ranges in user code, recorded on any machine for next to nothing.

The API mirrors Ascend's mstx (``mark``, ``range_start``, ``range_end``) plus a ``range``
context manager/decorator and named domains. With no profiling session active every call is
one global check and a return (cheaper than an NVTX push/pop with no tool attached). While a
:class:`probe.profiler.session.Session` records, each call appends one tuple with a
``time.perf_counter_ns`` timestamp to a per-thread buffer; a background stage drains the buffers
in batches, pairs starts with ends (``range_end`` may run on another thread than
``range_start``) and hands finished events to the sinks (Arrow store, Perfetto trace, OTel).

Bad input never raises into user code: an end without a start, an unknown id, a range never
ended, a message that is not a string or is huge are all counted and reported when the
session ends.

With ``stream=`` (a ``torch.cuda.Stream``) a range also gets device timestamps: CUDA events are
recorded on that stream and resolved later, without blocking the caller.

>>> from probe.profiler import mstx
>>> rid = mstx.range_start("load batch", domain="dataloader")
>>> mstx.range_end(rid, domain="dataloader")
>>> with mstx.range("forward", domain="engine"):
...     pass
>>> @mstx.range("train_step")
... def train_step():
...     return 1
>>> train_step()
1
>>> comm = mstx.domain("communication")
>>> comm.mark("all_reduce issued")
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from threading import get_ident
from typing import Any, Callable

from probe.ground.native import native_enabled

__all__ = ["mark", "range_start", "range_end", "range", "domain", "Domain", "is_recording"]

# Raw records appended to a thread's buffer, all of five items (kind code first):
#   (MARK, 0 or id, t_ns, message, domain)     id only for a mark with a stream
#   (START, range_id, t_ns, message, domain)
#   (END, range_id, t_ns, domain, None)
# The C extension ``profiler._mstx_native`` (built at install, see setup.py) keeps them in
# arrays and replaces mark/range_start/range_end below; without it the pure-Python functions
# append tuples to a per-thread list. PROBE_NATIVE=0 forces the Python path.
# Device timing events (ranges and marks given a stream) wait in _device_starts/_device_ends.
MARK, START, END = 0, 1, 2

# --- state switched by profiler.event_recorder.EventRecorder; read on every call -----------
_active = False          # marks and range starts are recorded
_ends = False            # range ends are recorded (stays on in a session's tail, see EventRecorder)
_local = threading.local()               # .push: this thread's buffer's append
_new_buffer: Callable[[], list] = list   # replaced by the recorder: registers a thread's buffer
_complete: list = []                     # finished ranges from built-in wrappers (events.emit_complete)
_streams: dict[int, Any] = {}            # range id -> stream, only for ranges given a stream
_device_starts: dict[int, Any] = {}      # id -> device event recorded at the start/mark
_device_ends: dict[int, Any] = {}        # id -> device event recorded at the end/mark
_device_event: Callable[[Any], Any] | None = None   # records a timing event on a stream

_next_id = itertools.count(1).__next__
_now = time.perf_counter_ns


def mark(message: Any, stream: Any = None, domain: str = "default") -> None:
    """Record an instant event ``message`` in ``domain`` (device-timestamped with ``stream``).

    >>> mark("checkpoint written", domain="checkpoint")
    """
    if _active:
        if stream is None:
            try:
                push = _local.push
            except AttributeError:
                push = _register()
            push((0, 0, _now(), message, domain))
        else:
            _mark_on_stream(message, stream, domain)


def range_start(message: Any, stream: Any = None, domain: str = "default") -> int:
    """Open a range named ``message``; return its id for :func:`range_end` (0 when not recording).

    >>> rid = range_start("all_reduce", domain="communication")
    >>> range_end(rid, domain="communication")
    """
    if not _active:
        return 0
    if stream is not None:
        return _start_on_stream(message, stream, domain)
    rid = _next_id()
    try:
        push = _local.push
    except AttributeError:
        push = _register()
    push((1, rid, _now(), message, domain))
    return rid


def range_end(range_id: int, domain: str = "default") -> None:
    """Close the range ``range_id`` (any thread may close it); id 0 is ignored.

    >>> range_end(0)
    """
    if _ends and range_id:
        try:
            push = _local.push
        except AttributeError:
            push = _register()
        if _streams:
            _end_on_stream(range_id)
        push((2, range_id, _now(), domain, None))


def is_recording() -> bool:
    """True while a profiling session records marks and ranges."""
    return _active


def _set_state(active: bool, ends: bool) -> None:
    """Switch recording of marks/starts (``active``) and of range ends (``ends``)."""
    global _active, _ends
    _active, _ends = active, ends
    if _native is not None:
        _native.set_state(active, ends)


def _push(code: int, rid: Any, t_ns: int, a: Any, b: Any) -> None:
    """Append one raw record to this thread's buffer (the pure-Python path)."""
    try:
        push = _local.push
    except AttributeError:
        push = _register()
    push((code, rid, t_ns, a, b))


def _register() -> Callable[[tuple], None]:
    """This thread's buffer, registered with the recorder on the thread's first call."""
    push = _local.push = _new_buffer().append
    return push


def _mark_on_stream(message: Any, stream: Any, domain: Any) -> None:
    rid = _next_id()
    _device_starts[rid] = _device_ends[rid] = _stream_event(stream)
    _push(0, rid, _now(), message, domain)


def _start_on_stream(message: Any, stream: Any, domain: Any) -> int:
    rid = _next_id()
    _streams[rid] = stream
    _device_starts[rid] = _stream_event(stream)
    _push(1, rid, _now(), message, domain)
    return rid


def _end_on_stream(range_id: Any) -> None:
    try:
        stream = _streams.pop(range_id, None)
    except TypeError:                       # an unhashable id: counted by the recorder
        return
    if stream is not None:
        _device_ends[range_id] = _stream_event(stream)


def _stream_event(stream: Any) -> Any:
    """A device timing event recorded on ``stream`` now (None if it cannot be recorded)."""
    if _device_event is None:
        return None
    try:
        return _device_event(stream)
    except Exception:  # noqa: BLE001 - a bad stream must not raise into user code
        return None


class range:  # noqa: N801 - mirrors mstx/nvtx naming; shadows the builtin only inside this module
    """A range as a context manager or a decorator.

    One instance may be entered by several threads at once, or nested: each thread closes the
    range it opened last.

    >>> with range("eval", domain="engine"):
    ...     pass
    >>> @range("step")
    ... def step():
    ...     pass
    """

    __slots__ = ("message", "stream", "domain", "_tid", "_rid", "_more")

    def __init__(self, message: Any, stream: Any = None, domain: str = "default") -> None:
        self.message = message
        self.stream = stream
        self.domain = domain
        self._tid = 0                                  # the usual case: one entry at a time
        self._rid = 0
        self._more: dict[int, list[int]] | None = None    # nested or concurrent entries

    def __enter__(self) -> "range":
        if _active:
            rid = range_start(self.message, self.stream, self.domain)
            if not self._rid:
                self._tid = get_ident()
                self._rid = rid
            else:
                if self._more is None:
                    self._more = {}
                self._more.setdefault(get_ident(), []).append(rid)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rid or self._more:
            tid = get_ident()
            if self._more:
                ids = self._more.get(tid)
                if ids:
                    range_end(ids.pop(), self.domain)
                    return
            if self._tid == tid:
                range_end(self._rid, self.domain)
                self._rid = 0

    def __call__(self, func: Callable) -> Callable:
        message, stream, dom = self.message, self.stream, self.domain

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _active:
                return func(*args, **kwargs)
            rid = range_start(message, stream, dom)
            try:
                return func(*args, **kwargs)
            finally:
                range_end(rid, dom)

        return wrapper


class Domain:
    """Marks and ranges bound to one domain name (like ``nvtx.Domain``).

    >>> d = Domain("dataloader")
    >>> rid = d.range_start("fetch")
    >>> d.range_end(rid)
    >>> with d.range("collate"):
    ...     pass
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def mark(self, message: Any, stream: Any = None) -> None:
        mark(message, stream, self.name)

    def range_start(self, message: Any, stream: Any = None) -> int:
        return range_start(message, stream, self.name)

    def range_end(self, range_id: int) -> None:
        range_end(range_id, self.name)

    def range(self, message: Any, stream: Any = None) -> range:
        return range(message, stream, self.name)

    def __repr__(self) -> str:
        return f"Domain({self.name!r})"


_domains: dict[str, Domain] = {}


def domain(name: str) -> Domain:
    """The :class:`Domain` called ``name`` (one object per name).

    >>> domain("engine") is domain("engine")
    True
    """
    d = _domains.get(name)
    if d is None:
        d = _domains.setdefault(name, Domain(name))
    return d


_native: Any = None
if native_enabled():
    try:
        from probe.profiler import _mstx_native as _native
    except ImportError:          # not built (no C compiler at install): the Python path records
        _native = None
if _native is not None:
    _native.configure(_streams, _mark_on_stream, _start_on_stream, _end_on_stream)
    mark, range_start, range_end = _native.mark, _native.range_start, _native.range_end  # noqa: F811
    _next_id, _now, _push = _native.next_id, _native.now, _native.push  # noqa: F811
