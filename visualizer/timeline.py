"""Timeline spans for the UI from a merged Chrome/Perfetto trace JSON or a record store.

A span is one bar on the timeline: a lane (``rank R · thread``), a name, a category (domain or
kind), start and duration in microseconds from the trace's first event, and its arguments.

>>> spans = load_trace_spans("runs/demo/profile/trace.json")          # doctest: +SKIP
>>> spans[0].lane, spans[0].name                                       # doctest: +SKIP
('rank 0 · main', 'step 0')
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from probe.ground.errors import ProbeError

#: The most spans handed to the UI (the longest are kept).
MAX_SPANS = 20_000


@dataclass
class Span:
    lane: str
    name: str
    cat: str
    start_us: float
    dur_us: float
    args: dict[str, Any] = field(default_factory=dict)


def _finish(spans: list[Span]) -> list[Span]:
    if not spans:
        return spans
    t0 = min(s.start_us for s in spans)
    for s in spans:
        s.start_us -= t0
    if len(spans) > MAX_SPANS:
        spans = sorted(spans, key=lambda s: -s.dur_us)[:MAX_SPANS]
    return sorted(spans, key=lambda s: (s.lane, s.start_us))


def load_trace_spans(path: str | os.PathLike) -> list[Span]:
    """Spans of a Chrome trace JSON (``{"traceEvents": [...]}`` or a bare list): complete
    events ("X"), begin/end pairs ("B"/"E") and instants ("i", drawn 0 wide)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ProbeError(f"{path}: invalid trace JSON (line {e.lineno}: {e.msg})") from None
    except OSError as e:
        raise ProbeError(f"{path}: cannot read the trace ({e.strerror})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ProbeError(f"{path}: not a Chrome trace (no traceEvents list)")
    procs: dict[Any, str] = {}
    threads: dict[tuple, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            name = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name" and name:
                procs[e.get("pid")] = str(name)
            elif e.get("name") == "thread_name" and name:
                threads[(e.get("pid"), e.get("tid"))] = str(name)

    def lane(e: dict) -> str:
        pid, tid = e.get("pid"), e.get("tid")
        return f"{procs.get(pid, f'pid {pid}')} · {threads.get((pid, tid), f'tid {tid}')}"

    spans: list[Span] = []
    open_: dict[tuple, list[dict]] = {}
    for e in events:
        if not isinstance(e, dict) or "ts" not in e:
            continue
        ph = e.get("ph")
        try:
            ts = float(e["ts"])
        except (TypeError, ValueError):
            continue
        cat = str(e.get("cat") or "")
        if ph == "X":
            spans.append(Span(lane(e), str(e.get("name", "")), cat, ts, float(e.get("dur") or 0.0),
                              e.get("args") or {}))
        elif ph == "B":
            open_.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif ph == "E":
            stack = open_.get((e.get("pid"), e.get("tid")))
            if stack:
                b = stack.pop()
                spans.append(Span(lane(b), str(b.get("name", "")), str(b.get("cat") or ""),
                                  float(b["ts"]), ts - float(b["ts"]), b.get("args") or {}))
        elif ph in ("i", "I", "n"):
            spans.append(Span(lane(e), str(e.get("name", "")), cat or "mark", ts, 0.0, e.get("args") or {}))
    return _finish(spans)


def store_spans(store_dir: str | os.PathLike) -> list[Span]:
    """Spans of the ``events`` records in the store under ``store_dir`` (host clock)."""
    from probe.collectors.store import open_store

    con = open_store(store_dir)
    try:
        rows = con.execute(
            "select rank, thread, domain, name, kind, host_start_ns, host_end_ns, payload "
            "from events where host_start_ns is not null order by host_start_ns").fetchall()
    finally:
        con.close()
    spans = []
    for rank, thread, domain, name, kind, start, end, payload in rows:
        try:
            args = json.loads(payload) if payload else {}
        except json.JSONDecodeError:
            args = {"payload": payload}
        spans.append(Span(f"rank {rank} · {domain or kind}", str(name), str(kind or domain or ""),
                          start / 1e3, max(0.0, ((end or start) - start) / 1e3),
                          args if isinstance(args, dict) else {"payload": args}))
    return _finish(spans)
