"""OpenTelemetry sink: profiler events as spans, exported by an exporter the user configures.

Ranges become spans (parent = the range that encloses them on the same thread), marks become
zero-length spans, timestamps are Unix-epoch ns. A range is finished after the ranges inside it,
so the sink keeps a session's events and builds the span tree when the session closes (a
session records a bounded number of steps). Attributes: ``probe.domain``, ``probe.kind``,
``probe.rank``, ``probe.step`` and the event payload (``probe.op``, ``probe.bytes``, ...).

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

from typing import Any, Sequence


class OTelSink:
    """Sends events to ``exporter`` (any ``SpanExporter``) through its own tracer provider.

    ``processor``: ``"batch"`` (a background thread with a bounded queue; the default) or
    ``"simple"`` (export as each span ends; for tests and debugging).
    """

    def __init__(self, exporter: Any, processor: str = "batch", service_name: str = "probe") -> None:
        self.exporter = exporter
        self.processor = processor
        self.service_name = service_name
        self.provider: Any = None
        self.tracer: Any = None
        self.meta: Any = None
        self.events: list[Any] = []

    def open(self, meta: Any) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        self.meta = meta
        resource = Resource.create({"service.name": self.service_name, "probe.run": str(meta.run),
                                    "probe.rank": int(meta.rank),
                                    "probe.world_size": int(meta.world_size)})
        self.provider = TracerProvider(resource=resource)
        self.tracer = self.provider.get_tracer("probe.profiler")

    def write(self, events: Sequence[Any]) -> None:
        self.events.extend(events)

    def close(self) -> None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if self.provider is None:
            return
        if self.processor == "simple":
            self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        else:   # every span is made here at once: the queue holds them all, none is dropped
            self.provider.add_span_processor(BatchSpanProcessor(
                self.exporter, max_queue_size=max(2048, len(self.events) + 1), max_export_batch_size=512))
        self._export(sorted(self.events, key=lambda e: (e.start_ns, -(e.end_ns - e.start_ns))))
        self.events = []
        self.provider.force_flush()
        self.provider.shutdown()
        self.provider = None

    def _export(self, events: list[Any]) -> None:
        from opentelemetry import trace

        epoch = int(getattr(self.meta, "epoch_offset_ns", 0))
        rank = int(self.meta.rank)
        stacks: dict[int, list[tuple[int, Any]]] = {}   # thread -> open (end_ns, span)
        for e in events:
            stack = stacks.setdefault(e.thread, [])
            while stack and stack[-1][0] <= e.start_ns:
                stack.pop()
            parent = stack[-1][1] if stack and e.end_ns <= stack[-1][0] else None
            ctx = trace.set_span_in_context(parent) if parent is not None else None
            attrs: dict[str, Any] = {"probe.domain": e.domain, "probe.kind": e.kind, "probe.rank": rank}
            if e.step is not None:
                attrs["probe.step"] = int(e.step)
            if e.device_start_ns is not None and e.device_end_ns is not None:
                attrs["probe.device_start_ns"] = int(e.device_start_ns + epoch)
                attrs["probe.device_end_ns"] = int(e.device_end_ns + epoch)
            for k, v in (e.payload or {}).items():
                attrs[f"probe.{k}"] = v if isinstance(v, (str, bool, int, float)) else str(v)
            span = self.tracer.start_span(e.name, context=ctx, start_time=int(e.start_ns + epoch),
                                          attributes=attrs)
            span.end(end_time=int(e.end_ns + epoch))
            if e.kind != "mark" and e.end_thread == e.thread:
                stack.append((e.end_ns, span))
