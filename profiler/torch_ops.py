"""torch.profiler's op-level activity in a session's trace, on the session's clock.

A session with ``torch_ops=True`` runs a :class:`TorchOps`: ``torch.profiler.profile`` is on
while a step is active (:meth:`TorchOps.start` / :meth:`TorchOps.stop`), and what it recorded
is kept as Chrome trace events moved onto the session's clock and the rank's process track
(for the Perfetto trace sink), and given as event records by :meth:`TorchOps.batch` (domain
``torch.<category>``; device kernels have kind ``kernel``) to the other sinks.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from typing import Any

from probe.profiler.events import Event, EventBatch
from probe.profiler.sinks import TraceMeta

#: torch.profiler categories that ran on a device
KERNEL_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


class TorchOps:
    """torch.profiler switched on over active steps; ``events``: what it recorded so far."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._prof: Any = None

    def start(self) -> None:
        """Switch torch.profiler on (CPU ops, and CUDA kernels where there is a GPU)."""
        if self._prof is not None:
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities)
        self._prof.__enter__()

    def stop(self, meta: TraceMeta) -> None:
        """Switch torch.profiler off; keep its events on the clock and track of ``meta``'s rank."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        finally:
            os.unlink(path)
        self.events.extend(on_our_clock(data, meta))

    def batch(self, win_starts: list[int], win_steps: list[int | None],
              clock_offset_ns: int) -> EventBatch:
        """The ops as event records, each in the step whose window it started in (ops of a
        step that is not kept are left out); ``win_starts`` are on the unaligned clock."""
        rows = []
        for ev in self.events:
            if ev.get("ph") != "X":
                continue
            start = int(round(ev["ts"] * 1000))
            i = bisect.bisect_right(win_starts, start - clock_offset_ns) - 1
            step = win_steps[i] if i >= 0 else None
            if step is None:
                continue
            cat = str(ev.get("cat", "op"))
            tid_text = str(ev.get("tid", "")).rsplit(" ", 1)[-1]    # "torch <tid>"
            tid = int(tid_text) if tid_text.isdigit() else 0
            rows.append(Event(f"torch.{cat}", str(ev.get("name", "")),
                              "kernel" if cat in KERNEL_CATEGORIES else "range", start,
                              start + int(round(float(ev.get("dur", 0)) * 1000)), tid, tid,
                              None, None, None, step))
        return EventBatch.from_events(rows)


def on_our_clock(data: dict, meta: TraceMeta) -> list[dict]:
    """torch.profiler's Chrome events moved onto this session's clock and rank's process.

    >>> data = {"baseTimeNanoseconds": 0, "traceEvents": [
    ...     {"ph": "X", "name": "aten::mm", "ts": 5.0, "dur": 1.0, "tid": 9}]}
    >>> [(e["ph"], e["tid"]) for e in on_our_clock(data, TraceMeta())]
    [('M', 'torch 9'), ('X', 'torch 9')]
    """
    base_us = data.get("baseTimeNanoseconds", 0) / 1000.0
    shift_us = base_us - meta.epoch_offset_ns / 1000.0
    rank = meta.rank
    out = []
    for ev in data.get("traceEvents", []):
        if not isinstance(ev, dict) or ev.get("ph") not in ("X", "i", "I"):
            continue
        ev = dict(ev)
        ev["ts"] = float(ev.get("ts", 0)) + shift_us
        ev["pid"] = rank
        ev["tid"] = f"torch {ev.get('tid', 0)}"
        ev.setdefault("cat", "torch")
        out.append(ev)
    out.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    tids = sorted({e["tid"] for e in out})
    for t in tids:
        out.insert(0, {"name": "thread_name", "ph": "M", "pid": rank, "tid": t, "args": {"name": t}})
    return out
