"""Packing recorded steps into columnar metric batches, the agent's side of the wire format.

A :class:`~probe.monitor.proto.monitor_pb2.MetricBatch` carries its points as four little-endian
columns (``name_index`` i32 into ``names``, ``steps`` i64, ``time_ns`` i64, ``values`` f64), so
neither side handles points one by one. :class:`BatchPacker` turns what the agent drained from
its queue into such batches:

1. each step's metrics become points; a value that is not a real number (a bool, a string,
   None) is skipped, and so is a metric whose name is not 1 to 256 characters, or a negative
   step (each said once through ``warn``);
2. a batch is cut when it holds ``max_points`` points; every batch gets the next ``seq``
   (1, 2, ... per packer, that is per agent);
3. the first batch carries the count of points dropped since the last one that told it; a call
   that has no points still makes one (empty) batch when it has such a count to tell, or when
   it is the ``final`` one (the last batch of the agent is marked ``final``).

The service decodes the same columns in :func:`probe.monitor.service.ingest.decode_batch`.

>>> packer = BatchPacker("job", 0, "agent-1", max_points=2, warn=print)
>>> items = [(0, 5, {"loss": 2.5, "note": "x"}), (1, 6, {"loss": 2.4}), (2, 7, {"lr": 1e-3})]
>>> [(b.seq, list(b.names), len(b.values) // 8) for b in packer.pack(items)]
[(1, ['loss'], 2), (2, ['lr'], 1)]
>>> [(b.seq, b.dropped, b.final) for b in packer.pack([], dropped=3, final=True)]
[(3, 3, True)]
"""

from __future__ import annotations

import array
import numbers
import sys
from typing import Any, Callable, Mapping, Sequence

from probe.monitor.limits import MAX_NAME_LEN


class BatchPacker:
    """Packs ``(step, time_ns, metrics)`` items into numbered batches; see the module docstring.

    ``warn(key, message)`` is told of what is skipped; ``key`` names the kind of trouble, so the
    caller can say each once.
    """

    def __init__(self, job: str, rank: int, agent_id: str, *, max_points: int,
                 warn: Callable[[str, str], None]) -> None:
        self.job, self.rank, self.agent_id = job, rank, agent_id
        self.max_points = max_points
        self.warn = warn
        self.seq = 0
        self._reset()

    def _reset(self) -> None:
        self._names: dict[str, int] = {}
        self._idx, self._steps = array.array("i"), array.array("q")
        self._times, self._values = array.array("q"), array.array("d")

    def pack(self, items: Sequence[tuple[int, int, Mapping[str, Any]]], *, dropped: int = 0,
             final: bool = False) -> list[Any]:
        """``items`` as MetricBatch messages; the first tells ``dropped``, the last ``final``."""
        batches: list[Any] = []
        for step, time_ns, metrics in items:
            self._add(step, time_ns, metrics)
            if len(self._values) >= self.max_points:
                self._cut(batches, dropped, final)
        if len(self._values) or not batches:
            self._cut(batches, dropped, final)
        if final and batches:
            batches[-1].final = True
        return batches

    def _add(self, step: int, time_ns: int, metrics: Mapping[str, Any]) -> None:
        if step < 0:
            self.warn("step", f"negative step {step} is not sent")
            return
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, numbers.Real)):
                continue
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LEN:
                self.warn(f"name{name!r}"[:80], f"metric name {name!r} is not sent "
                          f"(names are 1 to {MAX_NAME_LEN} characters)")
                continue
            i = self._names.get(name)
            if i is None:
                i = self._names[name] = len(self._names)
            self._idx.append(i)
            self._steps.append(int(step))
            self._times.append(time_ns)
            self._values.append(float(value))

    def _cut(self, batches: list[Any], dropped: int, final: bool) -> None:
        """Close the points so far into one batch (none when there is nothing to tell)."""
        from probe.monitor.proto import monitor_pb2 as pb

        if not len(self._values) and not batches and not final and not dropped:
            return
        columns = (self._idx, self._steps, self._times, self._values)
        if sys.byteorder != "little":
            for column in columns:
                column.byteswap()
        self.seq += 1
        batches.append(pb.MetricBatch(
            job=self.job, rank=self.rank, agent_id=self.agent_id, seq=self.seq,
            names=list(self._names), name_index=self._idx.tobytes(), steps=self._steps.tobytes(),
            time_ns=self._times.tobytes(), values=self._values.tobytes(),
            dropped=0 if batches else dropped))
        self._reset()
