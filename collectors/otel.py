"""OpenTelemetry sink: profiler events as spans, streamed to an exporter while the run goes.

Each batch of finished events the session drains (every ~50 ms) becomes spans at once and goes
to a ``BatchSpanProcessor`` (its own background thread), so a collector sees a step's spans a
few seconds after the step, not when the session closes. Any ``SpanExporter`` works: OTLP
(:mod:`probe.collectors.otlp`), console, in-memory.

Nesting: a span's parent is the innermost range that encloses it on the same thread; an event
with none there hangs under the ``step`` span of its step (domain ``step``: the bundled
engine's ``step N`` ranges, a script's optimizer steps); else it is the root of a trace of its
own. A range ends after the ranges inside it, so when a child is exported its parent is often
still open: the session tells the sink which ranges are open now (``meta.open_ranges()``, a
list of events whose ``end_ns`` is -1), the sink gives such a parent its trace and span ids
then, and uses them when it ends. A range still open when the session closes is exported with
the end of the last event seen and ``probe.unclosed`` set, so no child points at a span that
never comes. Every recorded event is exported (sampling would cut traces apart: select steps
with the session instead); nothing is dropped while the collector takes them: when the
processor's queue would overflow, the sink waits for an export (on the drain thread, never the
hot path). When an export fails (the collector is down), the next ones fail at once for
:data:`PAUSE_AFTER_FAILURE_S` and the sink no longer waits, so recording is never held up by a
collector that is away; what was lost is counted and raised by :meth:`OTelSink.close` (the
session reports it as a sink error).

Resource: ``service.name`` (``OTEL_SERVICE_NAME``, else ``probe``; ``OTEL_RESOURCE_ATTRIBUTES``
are merged), ``probe.run``, ``probe.job`` (the same name), ``probe.rank``,
``probe.world_size``. Span attributes: ``probe.domain``, ``probe.kind``, ``probe.rank``,
``probe.step``, ``thread.id``, ``thread.name`` and the event payload (``probe.op``,
``probe.bytes``, ...). Timestamps are Unix-epoch ns.

>>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
>>> from types import SimpleNamespace as E
>>> exporter = InMemorySpanExporter()
>>> sink = OTelSink(exporter, processor="simple")
>>> sink.open(E(rank=0, world_size=1, run="r", epoch_offset_ns=0))
>>> sink.write([E(domain="engine", name="step", kind="range", start_ns=0, end_ns=10, thread=1,
...               end_thread=1, device_start_ns=None, device_end_ns=None, payload=None, step=0)])
>>> sink.close()
>>> [s.name for s in exporter.get_finished_spans()]
['step']
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import OrderedDict
from typing import Any, Sequence

#: Spans waiting in the batch processor at most (``OTEL_BSP_MAX_QUEUE_SIZE`` overrides it).
DEFAULT_QUEUE = 16384
#: Seconds exports fail at once after one failed (the collector is down or refuses).
PAUSE_AFTER_FAILURE_S = 30.0
#: Step spans remembered as parents of events that arrive after their step was exported.
STEPS_KEPT = 256
_INF = float("inf")


#: What ``otel=`` (``--otel``) may name.
EXPORTERS = ("console", "otlp")


def span_exporter_from(otel: Any) -> Any:
    """The span exporter an ``otel`` option names: ``"otlp"`` (the OTLP exporter the
    ``OTEL_EXPORTER_OTLP_*`` variables configure, :mod:`probe.collectors.otlp`), ``"console"``
    (print spans); an exporter object passes through; None (or False) stays None.

    >>> span_exporter_from(None) is None, type(span_exporter_from("console")).__name__
    (True, 'ConsoleSpanExporter')
    """
    if otel is None or otel is False:
        return None
    if otel == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if otel == "otlp":
        from probe.collectors import otlp

        exporter = otlp.span_exporter()
        exporter.probe_endpoint = f"{otlp.endpoint('traces')} ({otlp.protocol('traces')})"
        return exporter
    if isinstance(otel, str):
        from probe.ground.errors import ProbeError

        raise ProbeError(f"--otel {otel!r}: use {' or '.join(EXPORTERS)} "
                         "(or pass an exporter object in Python)")
    return otel


class _Item:
    """One event in the parent search: finished (``open`` False) or still open."""

    __slots__ = ("ev", "start", "end", "open", "thread", "key", "can_parent", "parent", "ids",
                 "parent_ids")

    def __init__(self, ev: Any, is_open: bool) -> None:
        self.ev = ev
        self.open = is_open
        self.start = ev.start_ns
        self.end = _INF if is_open else ev.end_ns
        self.thread = ev.thread
        self.key = (ev.thread, ev.domain, ev.start_ns)
        self.can_parent = ev.kind != "mark" and (is_open or ev.end_thread == ev.thread)
        self.parent: _Item | None = None
        self.ids: tuple[int, int] | None = None           # (trace id, span id)
        self.parent_ids: tuple[int, int] | None = None


class _Counting:
    """Wraps a span exporter: counts the spans it exported and failed to export, and after a
    failed export fails the next ones at once for :data:`PAUSE_AFTER_FAILURE_S` (a collector
    that is down costs one exporter timeout, not one per batch)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0
        self.error = ""
        self.paused_until = 0.0

    @property
    def failing(self) -> bool:
        return time.monotonic() < self.paused_until

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self.failing:
            self.failed += len(spans)
            return SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
        except Exception as e:  # noqa: BLE001 - counted, reported when the session closes
            self.error = f"{type(e).__name__}: {e}"[:200]
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
            self.paused_until = time.monotonic() + PAUSE_AFTER_FAILURE_S
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flush = getattr(self.inner, "force_flush", None)
        return flush(timeout_millis) if flush is not None else True

    def shutdown(self) -> None:
        self.inner.shutdown()


class OTelSink:
    """Streams events as spans to ``exporter`` (any ``SpanExporter``) through a span processor.

    ``processor``: ``"batch"`` (a ``BatchSpanProcessor``: its thread exports every
    ``OTEL_BSP_SCHEDULE_DELAY`` ms, 5000 by default, or as soon as 512 spans wait; the default)
    or ``"simple"`` (export as each span ends; for tests and debugging). ``service_name``:
    default ``OTEL_SERVICE_NAME`` or ``probe``. ``describe``: where the spans go, for messages.
    """

    def __init__(self, exporter: Any, processor: str = "batch", service_name: str | None = None,
                 describe: str = "") -> None:
        self.exporter = exporter
        self.processor = processor
        self.service_name = service_name
        self.describe = describe
        self.provider: Any = None         # the span processor while the sink is open
        self.meta: Any = None
        self.spans = 0                    # spans handed to the processor
        self._counting = _Counting(exporter)
        self._span_processor: Any = None
        self._queue = DEFAULT_QUEUE
        self._lock = threading.Lock()
        self._resource: Any = None
        self._scope: Any = None
        self._make: Any = None
        self._assigned: dict[tuple, _Item] = {}                 # open ranges given ids, by key
        self._steps: OrderedDict[int, tuple[int, int]] = OrderedDict()   # step -> its span's ids
        self._last_end = 0
        self._offset = 0                  # the rank's clock offset the keys were made with

    # --- the sink interface ------------------------------------------------------------------
    def open(self, meta: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.meta = meta
        self._offset = int(getattr(meta, "clock_offset_ns", 0) or 0)
        attrs: dict[str, Any] = {"probe.run": str(meta.run), "probe.job": str(meta.run),
                                 "probe.rank": int(meta.rank), "probe.world_size": int(meta.world_size)}
        name = self.service_name or os.environ.get("OTEL_SERVICE_NAME")
        if name or "service.name" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
            attrs["service.name"] = name or "probe"
        self._resource = Resource.create(attrs)
        self._scope = InstrumentationScope("probe.profiler")
        self._make = (ReadableSpan, trace.SpanContext, trace.TraceFlags(trace.TraceFlags.SAMPLED))
        if self.processor == "simple":
            self._span_processor = SimpleSpanProcessor(self._counting)
        else:
            self._queue = int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") or DEFAULT_QUEUE)
            batch = int(os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") or 512)
            self._span_processor = BatchSpanProcessor(self._counting, max_queue_size=self._queue,
                                                      max_export_batch_size=min(batch, self._queue))
        self.provider = self._span_processor      # open until close()

    def write(self, events: Sequence[Any]) -> None:
        if self.provider is None:
            return
        opened = getattr(self.meta, "open_ranges", None)
        with self._lock:
            self._follow_clock()
            self._export(list(events), list(opened()) if callable(opened) else [])

    def _follow_clock(self) -> None:
        """The rank's clock offset changed (measured after a script's ``init_process_group``):
        an open range given ids before ends with its start moved by the change, so its key moves
        too."""
        offset = int(getattr(self.meta, "clock_offset_ns", 0) or 0)
        delta, self._offset = offset - self._offset, offset
        if delta and self._assigned:
            moved = {}
            for it in self._assigned.values():
                it.start += delta
                it.key = (it.key[0], it.key[1], it.key[2] + delta)
                moved[it.key] = it
            self._assigned = moved

    def close(self) -> None:
        if self.provider is None:
            return
        with self._lock:
            for item in sorted(self._assigned.values(), key=lambda i: i.start):   # never ended
                self._emit(item, max(self._last_end, item.start), unclosed=True)
            self._assigned.clear()
            self._span_processor.force_flush()
            self._span_processor.shutdown()
            self.provider = None
        c = self._counting
        lost = self.spans - c.exported          # failed, or dropped by a full queue meanwhile
        if lost > 0:
            where = f" to {self.describe}" if self.describe else ""
            raise RuntimeError(f"{lost} of {self.spans} spans failed to export{where}"
                               + (f" ({c.error})" if c.error else ""))

    @property
    def exported(self) -> int:
        """Spans the exporter took."""
        return self._counting.exported

    # --- parents ---------------------------------------------------------------------------------
    def _export(self, events: list[Any], opened: list[Any]) -> None:
        items = [_Item(e, False) for e in events]
        ended = {it.key for it in items}
        items += [it for it in map(_Item, opened, [True] * len(opened)) if it.key not in ended]
        by_thread: dict[int, list[_Item]] = {}
        for it in items:
            by_thread.setdefault(it.thread, []).append(it)
        for group in by_thread.values():            # the innermost enclosing range on the thread
            group.sort(key=lambda i: (i.start, -i.end))
            stack: list[_Item] = []
            for it in group:
                while stack and stack[-1].end <= it.start and not stack[-1].open:
                    stack.pop()
                if stack and it.end <= stack[-1].end:
                    it.parent = stack[-1]
                if it.can_parent:
                    stack.append(it)
        step_items = {it.ev.step: it for it in items if it.ev.domain == "step" and it.can_parent}
        for it in items:
            self._ids(it, step_items)
        n = len(events)
        chunk = max(1, self._queue // 2)
        for lo in range(0, n, chunk):
            part = [it for it in items[lo:min(lo + chunk, n)]]
            if self.processor != "simple" and not self._counting.failing:
                waiting = self.spans - self._counting.exported - self._counting.failed
                if waiting + len(part) > self._queue:
                    self._span_processor.force_flush()   # wait rather than drop (collector up)
            for it in part:
                self._assigned.pop(it.key, None)
                self._emit(it, it.ev.end_ns)
        for it in items[n:]:
            self._assigned.setdefault(it.key, it)

    def _ids(self, it: _Item, step_items: dict[Any, _Item]) -> tuple[int, int]:
        if it.ids is not None:
            return it.ids
        known = self._assigned.get(it.key)
        if known is not None:
            it.ids, it.parent_ids = known.ids, known.parent_ids
            return it.ids
        parent_ids = None
        if it.parent is not None:
            parent_ids = self._ids(it.parent, step_items)
        elif it.ev.domain != "step":
            step = step_items.get(it.ev.step)
            if step is not None and step is not it:
                parent_ids = self._ids(step, step_items)
            else:
                parent_ids = self._steps.get(it.ev.step)
        trace_id = parent_ids[0] if parent_ids else random.getrandbits(128) or 1
        it.ids, it.parent_ids = (trace_id, random.getrandbits(64) or 1), parent_ids
        if it.ev.domain == "step" and it.can_parent and it.ev.step is not None:
            self._steps[it.ev.step] = it.ids
            while len(self._steps) > STEPS_KEPT:
                self._steps.popitem(last=False)
        return it.ids

    def _emit(self, it: _Item, end_ns: int, unclosed: bool = False) -> None:
        # a finished span built as the SDK's own ReadableSpan (ids chosen here, times known):
        # the exporters take it as any other, at an eighth of a tracer's cost per span (5 us)
        readable, span_context, sampled = self._make
        e = it.ev
        epoch = int(getattr(self.meta, "epoch_offset_ns", 0))
        attrs: dict[str, Any] = {"probe.domain": e.domain, "probe.kind": e.kind,
                                 "probe.rank": int(self.meta.rank), "thread.id": int(e.thread)}
        thread_name = getattr(self.meta, "thread_names", {}).get(e.thread)
        if thread_name:
            attrs["thread.name"] = thread_name
        if e.step is not None:
            attrs["probe.step"] = int(e.step)
        if unclosed:
            attrs["probe.unclosed"] = True
        if e.device_start_ns is not None and e.device_end_ns is not None:
            attrs["probe.device_start_ns"] = int(e.device_start_ns + epoch)
            attrs["probe.device_end_ns"] = int(e.device_end_ns + epoch)
        for k, v in (e.payload or {}).items():
            attrs[f"probe.{k}"] = v if isinstance(v, (str, bool, int, float)) else str(v)
        parent = it.parent_ids
        span = readable(
            name=str(e.name), context=span_context(it.ids[0], it.ids[1], False, sampled),
            parent=span_context(parent[0], parent[1], False, sampled) if parent else None,
            resource=self._resource, attributes=attrs, instrumentation_scope=self._scope,
            start_time=int(e.start_ns + epoch), end_time=int(end_ns + epoch))
        self._span_processor.on_end(span)
        self.spans += 1
        self._last_end = max(self._last_end, end_ns)
