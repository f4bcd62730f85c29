"""The profiler's finished events: one :class:`Event` row, an :class:`EventBatch` of columns.

An event is what the recording stage (:mod:`probe.profiler.event_recorder`) hands to the sinks: a
mark, a range (its start paired with its end), a communication call, a step or a device kernel,
timestamps in ns on the session's (aligned) host clock. Built-in wrappers that measure a whole
range themselves (communication calls, dataloader fetches, checkpoint saves, step ranges of a
script) hand it over with :func:`emit_complete`, no pairing needed.

>>> b = EventBatch.from_events([Event("engine", "forward", "range", 10, 20, 1, 1, None, None,
...                                   {"layer": 0}, 0)])
>>> [(e.name, e.end_ns - e.start_ns) for e in b], payload_json(b.payload[0])
([('forward', 10)], '{"layer":0}')
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Iterable, Iterator, NamedTuple

from probe.profiler import mstx

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
        """The batch of ``events`` (rows turned into columns)."""
        rows = list(events)
        return cls(**{f: [getattr(e, f) for e in rows] for f in Event._fields})

    def __len__(self) -> int:
        return len(self.start_ns)

    def __iter__(self) -> Iterator[Event]:
        make = tuple.__new__
        return (make(Event, row) for row in zip(*(getattr(self, f) for f in Event._fields)))


def emit_complete(name: str, domain: str, start_ns: int, end_ns: int, payload: dict | None = None) -> None:
    """Record a finished range measured by a built-in wrapper (no pairing needed).

    Does nothing when no session records; used for communication calls, step ranges,
    dataloader fetches and checkpoint saves. These go to one list shared by all threads (they
    carry their thread id), drained and bounded like the per-thread buffers.

    >>> emit_complete("fetch", "dataloader", 0, 5)      # no session: nothing is kept
    >>> mstx._complete
    []
    """
    if mstx._active:
        mstx._complete.append((start_ns, end_ns, name, domain, payload, threading.get_ident()))


def payload_json(payload: dict | None) -> str | None:
    """The JSON text stored for an event's payload (None stays None).

    >>> payload_json({"op": "all_reduce", "bytes": 64}), payload_json(None)
    ('{"op":"all_reduce","bytes":64}', None)
    """
    if payload is None:
        return None
    return json.dumps(payload, default=str, separators=(",", ":"))


def describe_problems(problems: Counter) -> str:
    """One line that says what went wrong with the recorded input, or '' when nothing did.

    >>> describe_problems(Counter({"unclosed_range": 2, "unmatched_end": 1}))
    'unclosed_range: 2, unmatched_end: 1'
    """
    return ", ".join(f"{k}: {v}" for k, v in sorted(problems.items()) if v)
