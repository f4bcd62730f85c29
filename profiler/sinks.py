"""Where a session's events go: the sink interface and the Arrow store sink.

A sink has three methods, called from the session's batching thread (never the hot path):
``open(meta)`` once, ``write(events)`` with each batch of finished events (sorted by start),
``close()`` once. ``meta`` is a :class:`TraceMeta`. The Perfetto trace sink lives in
:mod:`collectors.perfetto`, the OpenTelemetry sink in :mod:`collectors.otel`.

>>> import tempfile
>>> from collectors.store import StoreWriter, open_store
>>> from profiler.recorder import Event
>>> d = tempfile.mkdtemp()
>>> sink = StoreSink(StoreWriter(d, rank=0, run="r"), own_store=True)
>>> sink.open(TraceMeta(rank=0, world_size=1, run="r"))
>>> sink.write([Event("engine", "forward", "range", 10, 20, 1, 1, None, None, None, 0)])
>>> sink.close()
>>> open_store(d).sql("select name, host_end_ns - host_start_ns from events").fetchall()
[('forward', 10)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from profiler.recorder import Event, payload_json


@dataclass
class TraceMeta:
    """What a sink knows about the rank whose events it receives."""

    rank: int = 0
    world_size: int = 1
    run: str = "run"
    clock_offset_ns: int = 0          # added to this rank's clock to get rank 0's
    epoch_offset_ns: int = 0          # added to a (rank-0-aligned) timestamp to get Unix-epoch ns
    thread_names: dict[int, str] = field(default_factory=dict)


class Sink(Protocol):
    """The interface every event sink implements."""

    def open(self, meta: TraceMeta) -> None: ...

    def write(self, events: Sequence[Event]) -> None: ...

    def close(self) -> None: ...


class StoreSink:
    """Writes events as ``event`` records to a :class:`collectors.store.StoreWriter`.

    ``own_store``: close the writer at the end (a writer the engine owns stays open).
    """

    def __init__(self, store: Any, own_store: bool = False) -> None:
        self.store = store
        self.own_store = own_store
        self.meta = TraceMeta()

    def open(self, meta: TraceMeta) -> None:
        self.meta = meta

    def write(self, events: Sequence[Event]) -> None:
        from collectors.records import table_from_columns

        if not events:
            return
        n = len(events)
        columns = {
            "run": [self.meta.run] * n,
            "rank": [self.meta.rank] * n,
            "step": [e.step for e in events],
            "domain": [e.domain for e in events],
            "name": [e.name for e in events],
            "kind": [e.kind for e in events],
            "host_start_ns": [e.start_ns for e in events],
            "host_end_ns": [e.end_ns for e in events],
            "device_start_ns": [e.device_start_ns for e in events],
            "device_end_ns": [e.device_end_ns for e in events],
            "thread": [e.thread for e in events],
            "payload": [payload_json(_payload(e)) for e in events],
        }
        self.store.write("event", table_from_columns("event", columns))

    def close(self) -> None:
        if self.own_store:
            self.store.close()
        else:
            self.store.flush()


def _payload(e: Event) -> dict | None:
    if e.end_thread != e.thread:
        return {**(e.payload or {}), "end_thread": e.end_thread}
    return e.payload
