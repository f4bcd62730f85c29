"""Perfetto-loadable Chrome trace JSON: a per-rank sink and a merger (one process track per rank).

Each rank's events become Chrome trace events in the process ``pid = rank`` ("rank R"), one
thread track per Python thread, plus one track per CUDA device and stream for device
timestamps. Ranges
that nest on their thread are complete events (``ph: X``); a range that ends on another thread,
or overlaps a sibling without nesting, becomes an async pair (``ph: b``/``e``) so the thread
tracks stay strictly nested, which Perfetto's JSON importer requires. Timestamps are in
microseconds on rank 0's clock (each rank's measured offset is applied before they get here).

A rank writes its fragment with :class:`ChromeTraceSink` (``DIR/trace/rank<R>.json``);
:func:`merge_traces` joins fragments into one trace file.

>>> from types import SimpleNamespace as E
>>> ev = E(domain="engine", name="forward", kind="range", start_ns=1000, end_ns=5000, thread=7,
...        end_thread=7, device_start_ns=None, device_end_ns=None, payload=None, step=0)
>>> [e["ph"] for e in to_trace_events([ev], pid=0, thread_names={7: "MainThread"})]
['M', 'M', 'M', 'M', 'X']
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

DEVICE_TID_BASE = 1_000_000   # device tracks (one per device and stream) count up from here


def to_trace_events(events: Iterable[Any], pid: int, thread_names: dict[int, str] | None = None,
                    process_name: str | None = None) -> list[dict]:
    """Chrome trace events for one rank (``pid``), metadata first, then sorted by time."""
    thread_names = dict(thread_names or {})
    events = sorted(events, key=lambda e: (e.start_ns, -(e.end_ns - e.start_ns)))
    tids: dict[int, int] = {}

    def tid_of(ident: int) -> int:
        if ident not in tids:
            tids[ident] = len(tids) + 1
        return tids[ident]

    out: list[dict] = []
    stacks: dict[int, list[int]] = {}        # tid -> end_ns of open complete events
    async_ids = iter(range(1, 1 << 62))
    device_tids: dict[tuple[int, int], int] = {}     # (device, stream) -> track

    def span(e: Any, tid: int, start_ns: int, end_ns: int, args: dict, same_thread: bool) -> None:
        """One slice on track ``tid``: complete ("X") when it nests in the open ones and ends
        on its own thread, else an async pair ("b"/"e")."""
        stack = stacks.setdefault(tid, [])
        while stack and stack[-1] <= start_ns:
            stack.pop()
        ts = start_ns / 1000.0
        if same_thread and (not stack or end_ns <= stack[-1]):
            stack.append(end_ns)
            out.append({"name": e.name, "cat": e.domain, "ph": "X", "ts": ts,
                        "dur": max(end_ns - start_ns, 0) / 1000.0, "pid": pid, "tid": tid, "args": args})
            return
        ident = f"{pid}.{next(async_ids)}"
        out.append({"name": e.name, "cat": e.domain, "ph": "b", "id": ident, "ts": ts,
                    "pid": pid, "tid": tid, "args": args})
        out.append({"name": e.name, "cat": e.domain, "ph": "e", "id": ident,
                    "ts": max(end_ns, start_ns) / 1000.0, "pid": pid, "tid": tid})

    for e in events:
        args = {"domain": e.domain}
        if e.step is not None:
            args["step"] = e.step
        if e.payload:
            args.update(e.payload)
        tid = tid_of(e.thread)
        if e.kind == "mark":
            out.append({"name": e.name, "cat": e.domain, "ph": "i", "s": "t", "ts": e.start_ns / 1000.0,
                        "pid": pid, "tid": tid, "args": args})
            continue
        host_args = args
        if e.end_thread != e.thread:
            host_args = dict(args, end_thread=thread_names.get(e.end_thread, str(e.end_thread)))
        span(e, tid, e.start_ns, e.end_ns, host_args, e.end_thread == e.thread)
        if e.device_start_ns is not None and e.device_end_ns is not None:
            payload = e.payload if isinstance(e.payload, dict) else {}
            key = (payload.get("device", 0), payload.get("stream", 0))
            dtid = device_tids.setdefault(key, DEVICE_TID_BASE + len(device_tids))
            span(e, dtid, e.device_start_ns, e.device_end_ns, args, True)
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": process_name or f"rank {pid}"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
             "args": {"sort_index": pid}}]
    for ident, tid in tids.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": thread_names.get(ident, f"thread {ident}")}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}})
    for (dev, stream), dtid in device_tids.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": dtid,
                     "args": {"name": f"device {dev} stream {stream}"}})
    return meta + out


class ChromeTraceSink:
    """Collects one rank's events and writes ``path`` (a Chrome trace fragment) on close.

    Chrome trace dicts already on this rank's clock (torch.profiler's op events) can be appended
    with :meth:`add_raw`, and counter points (per-step loss, MFU) with :meth:`add_counters`,
    before close.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.events: list[Any] = []
        self.raw: list[dict] = []
        self.meta: Any = None

    def open(self, meta: Any) -> None:
        self.meta = meta

    def write(self, events: Sequence[Any]) -> None:
        self.events.extend(events)

    def add_raw(self, events: Iterable[dict]) -> None:
        self.raw.extend(events)

    def add_counters(self, points: Iterable[tuple[int, str, float]]) -> None:
        """Counter tracks (``ph: C``) of this rank: (time ns, name, value) points, e.g. loss, MFU."""
        pid = getattr(self.meta, "rank", 0)
        self.raw.extend({"name": name, "ph": "C", "ts": t / 1000.0, "pid": pid, "tid": 0,
                         "args": {name: value}} for t, name, value in points)

    def close(self) -> None:
        rank = getattr(self.meta, "rank", 0)
        names = getattr(self.meta, "thread_names", {})
        trace = {
            "traceEvents": to_trace_events(self.events, pid=rank, thread_names=names) + self.raw,
            "displayTimeUnit": "ms",
            "otherData": {
                "rank": rank,
                "world_size": getattr(self.meta, "world_size", 1),
                "run": getattr(self.meta, "run", ""),
                "clock_offset_ns": getattr(self.meta, "clock_offset_ns", 0),
                "epoch_offset_ns": getattr(self.meta, "epoch_offset_ns", 0),
            },
        }
        write_json(self.path, trace)


def merge_traces(fragments: Iterable[str | os.PathLike], out: str | os.PathLike) -> dict:
    """Join rank fragments into one Chrome trace at ``out``; return a summary.

    Fragments are already on rank 0's clock and each uses ``pid = rank``, so merging is a
    concatenation; ``otherData.ranks`` lists each rank's clock offset.
    """
    from probe.ground.errors import ProbeError

    events: list[dict] = []
    ranks: dict[str, Any] = {}
    files = sorted(Path(f) for f in fragments)
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as e:
            raise ProbeError(f"{f}: not a readable trace fragment ({e}); re-run the profile") from None
        if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
            raise ProbeError(f"{f}: not a Chrome trace (no traceEvents list)")
        events.extend(data["traceEvents"])
        other = data.get("otherData", {})
        ranks[str(other.get("rank", f.stem))] = {"clock_offset_ns": other.get("clock_offset_ns", 0)}
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"ranks": ranks, "producer": "probe profile"}}
    write_json(Path(out), trace)
    return {"path": str(out), "ranks": sorted(ranks, key=lambda r: int(r) if r.isdigit() else r),
            "events": len(events)}


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as JSON atomically (temporary name, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of this process and thread: ranks sharing a folder never rename each other's file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"))
    os.replace(tmp, path)
