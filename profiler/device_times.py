"""Device timestamps of ranges and marks given a stream: CUDA timing events on the host clock.

``mstx.range_start(msg, stream=s)`` (and ``mark``) records a CUDA event on ``s`` through
:meth:`DeviceTimes.event`; the first one on a device also records a reference event with the
host time it was taken, so a completed event's time is ``reference host ns + elapsed time``.
The recording stage holds back a row whose events have not completed yet and passes it on in
a later batch (at session end it waits for them). Torch is imported only when a stream is
first given.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from probe.profiler import mstx


class DeviceClock:
    """Maps CUDA timing events to host ns: a reference event is taken at start on each device."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.refs: dict[int, tuple[Any, int]] = {}

    def event(self, stream: Any) -> Any:
        """Record a timing event on ``stream``; returns (device, event, stream id)."""
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


class DeviceTimes:
    """The device side of one recording: records events, holds rows until their events complete.

    A device timestamp that cannot be had is counted in ``problems`` as
    ``device_timestamp_failed``; the row keeps its host times.
    """

    def __init__(self, problems: Counter) -> None:
        self.problems = problems
        self.clock: DeviceClock | None = None
        self.pending: list[tuple] = []     # (row dict, start event, end event)

    def event(self, stream: Any) -> Any:
        """Record a timing event on ``stream`` (what ``mstx`` calls for a range given a stream)."""
        if self.clock is None:
            self.clock = DeviceClock()
        return self.clock.event(stream)

    def add(self, cols: dict[str, list], rids: list, offset_ns: int, final: bool) -> dict[str, list]:
        """Hold back rows with device events until the events complete; add finished ones.

        ``cols`` are a batch's columns and ``rids`` the range id of each row; ``final``: the
        session ends, wait for every event.
        """
        starts, ends = mstx._device_starts, mstx._device_ends
        held = [i for i, rid in enumerate(rids) if rid and rid in starts]
        if held:
            for i in held:
                row = {k: v[i] for k, v in cols.items()}
                self.pending.append((row, starts.pop(rids[i]), ends.pop(rids[i], None)))
            gone = set(held)
            cols = {k: [x for j, x in enumerate(v) if j not in gone] for k, v in cols.items()}
        still = []
        for row, dev0, dev1 in self.pending:
            try:
                d0 = self.clock.resolve(dev0, final) if dev0 is not None else None
                d1 = self.clock.resolve(dev1, final) if dev1 is not None else None
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
            row["device_start_ns"] = d0 + offset_ns if d0 is not None else None
            row["device_end_ns"] = d1 + offset_ns if d1 is not None else None
            if dev0 is not None:
                row["payload"] = {**(row["payload"] or {}), "device": dev0[0], "stream": dev0[2]}
            for k, v in cols.items():
                v.append(row[k])
        self.pending = still
        return cols
