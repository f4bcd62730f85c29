"""Where a session's events go: the sink interface and the Arrow store sink.

A sink has three methods, called from the session's batching thread (never the hot path):
``open(meta)`` once, ``write(batch)`` with each :class:`probe.profiler.events.EventBatch` of finished
events (columns; iterating it yields :class:`probe.profiler.events.Event` rows), ``close()`` once.
``meta`` is a :class:`TraceMeta`. The Perfetto trace sink lives in
:mod:`probe.collectors.perfetto`, the OpenTelemetry sink in :mod:`probe.collectors.otel`. At the end of a
session the recording's own figures (overflow policy, records dropped and spooled, time
waited) go to the trace as :func:`recording_label` and to the store by
:meth:`StoreSink.add_recording`.

>>> import tempfile
>>> from probe.collectors.store import StoreWriter, open_store
>>> from probe.profiler.events import Event, EventBatch
>>> d = tempfile.mkdtemp()
>>> sink = StoreSink(StoreWriter(d, rank=0, run="r"), own_store=True)
>>> sink.open(TraceMeta(rank=0, world_size=1, run="r"))
>>> sink.write(EventBatch.from_events([Event("engine", "forward", "range", 10, 20, 1, 1,
...                                         None, None, None, 0)]))
>>> sink.close()
>>> open_store(d).sql("select name, host_end_ns - host_start_ns from events").fetchall()
[('forward', 10)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
from typing import Any, Callable, Protocol

from probe.profiler.events import EventBatch, payload_json


@dataclass
class TraceMeta:
    """What a sink knows about the rank whose events it receives."""

    rank: int = 0
    world_size: int = 1
    run: str = "run"
    clock_offset_ns: int = 0          # added to this rank's clock to get rank 0's
    epoch_offset_ns: int = 0          # added to a (rank-0-aligned) timestamp to get Unix-epoch ns
    thread_names: dict[int, str] = field(default_factory=dict)
    #: The ranges open now, as events whose ``end_ns`` is -1 (for a sink that streams nested
    #: spans, :mod:`probe.collectors.otel`); called from the drain thread, during ``write``.
    open_ranges: Callable[[], list] | None = None


#: The store metrics :meth:`StoreSink.add_recording` writes, by the recording figure they hold.
RECORDING_METRICS = {"dropped_records": "mstx_dropped_records", "spilled_records": "mstx_spilled_records",
                     "wait_ms": "mstx_wait_ms"}


def recording_label(rank: int, recording: dict[str, Any]) -> dict:
    """The trace metadata event that tells what recording rank ``rank`` lost or waited for.

    A ``process_labels`` event (shown beside the rank's track); its args also hold the figures
    by name, ``mstx_overflow`` and ``mstx_`` + each key of ``recording``.

    >>> e = recording_label(1, {"overflow": "drop", "dropped_records": 5, "spilled_records": 0,
    ...                         "wait_ms": 0.0})
    >>> e["args"]["labels"], e["args"]["mstx_dropped_records"]
    ('mstx: 5 records dropped (overflow drop)', 5)
    """
    dropped = recording["dropped_records"]
    text = (f"mstx: {dropped} records dropped (overflow {recording['overflow']})" if dropped
            else f"mstx: no record lost (overflow {recording['overflow']})")
    return {"name": "process_labels", "ph": "M", "pid": rank, "tid": 0,
            "args": {"labels": text, **{f"mstx_{k}": v for k, v in recording.items()}}}


class Sink(Protocol):
    """The interface every event sink implements."""

    def open(self, meta: TraceMeta) -> None: ...

    def write(self, events: EventBatch) -> None: ...

    def close(self) -> None: ...


class StoreSink:
    """Writes events as ``event`` records to a :class:`probe.collectors.store.StoreWriter`.

    ``own_store``: close the writer at the end (a writer the engine owns stays open).
    """

    def __init__(self, store: Any, own_store: bool = False) -> None:
        self.store = store
        self.own_store = own_store
        self.meta = TraceMeta()

    def open(self, meta: TraceMeta) -> None:
        self.meta = meta

    def write(self, events: EventBatch) -> None:
        from probe.collectors.records import table_from_columns

        n = len(events)
        if not n:
            return
        payload = [payload_json(p) if p is not None else None for p in events.payload]
        if events.thread != events.end_thread:
            payload = [payload_json({**(json.loads(p) if p else {}), "end_thread": e}) if t != e else p
                       for p, t, e in zip(payload, events.thread, events.end_thread)]
        columns = {
            "run": [self.meta.run] * n,
            "rank": [self.meta.rank] * n,
            "step": events.step,
            "domain": events.domain,
            "name": events.name,
            "kind": events.kind,
            "host_start_ns": events.start_ns,
            "host_end_ns": events.end_ns,
            "device_start_ns": events.device_start_ns,
            "device_end_ns": events.device_end_ns,
            "thread": events.thread,
            "payload": payload,
        }
        self.store.write("event", table_from_columns("event", columns))

    def add_recording(self, recording: dict[str, Any], step: int) -> None:
        """Write the recording's figures (:data:`RECORDING_METRICS`) as metric points of
        ``step`` (the session's last, so the per-step views gain no row)."""
        import time

        now = time.time_ns()
        self.store.write_rows("metric", [
            {"time_ns": now, "job": self.meta.run, "rank": self.meta.rank, "step": int(step),
             "name": name, "value": float(recording[key])} for key, name in RECORDING_METRICS.items()])

    def close(self) -> None:
        if self.own_store:
            self.store.close()
        else:
            self.store.flush()
