"""Ingest: pushed metric batches decoded into Arrow and written to the store by group commit.

1. ``Push`` decodes a batch with :func:`decode_batch` (its columns straight into an Arrow
   table, no per-point Python) and hands it to :meth:`IngestWriter.write`, which waits;
2. the writer thread (a :class:`~probe.ground.background.BackgroundQueue` worker) takes every batch
   waiting and inserts them in one transaction with their (agent_id, seq) keys, up to
   ``MAX_GROUP_POINTS`` points a transaction: one fsync for many ranks;
3. then it wakes their callers: an ack means durable, and a batch resent after a lost ack is
   found by its key and acknowledged without being stored again (``fresh`` False).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa

from probe.ground.background import BackgroundQueue
from probe.monitor.limits import MAX_BATCH_POINTS, MAX_NAME_LEN
from probe.monitor.proto import monitor_pb2 as pb
from probe.monitor.service.storage import BatchKey, MonitorStore

#: Group commit: the most points inserted in one transaction.
MAX_GROUP_POINTS = 1_000_000
#: Seconds a pushed batch waits for the store before its caller is told to resend it.
ACK_TIMEOUT_S = 60.0


def decode_batch(batch: pb.MetricBatch) -> pa.Table:
    """The batch's points as a ``metric`` table; ValueError says what is malformed.

    >>> b = pb.MetricBatch(job="j", rank=1, agent_id="a", seq=1, names=["loss"],
    ...                    name_index=np.int32([0]).tobytes(), steps=np.int64([7]).tobytes(),
    ...                    time_ns=np.int64([5]).tobytes(), values=np.float64([2.5]).tobytes())
    >>> decode_batch(b).to_pylist()
    [{'time_ns': 5, 'job': 'j', 'rank': 1, 'step': 7, 'name': 'loss', 'value': 2.5}]
    """
    if len(batch.values) % 8:
        raise ValueError("values is not a whole number of float64")
    n = len(batch.values) // 8
    if n > MAX_BATCH_POINTS:
        raise ValueError(f"{n} points in one batch; the limit is {MAX_BATCH_POINTS}")
    if len(batch.name_index) != 4 * n or len(batch.steps) != 8 * n or len(batch.time_ns) != 8 * n:
        raise ValueError(f"columns disagree: {n} values but name_index/steps/time_ns have "
                         f"{len(batch.name_index)}/{len(batch.steps)}/{len(batch.time_ns)} bytes")
    names = list(batch.names)
    if any(not s or len(s) > MAX_NAME_LEN for s in names):
        raise ValueError(f"metric names must be 1 to {MAX_NAME_LEN} characters")
    idx = np.frombuffer(batch.name_index, dtype="<i4")
    if n and (int(idx.min()) < 0 or int(idx.max()) >= len(names)):
        raise ValueError(f"name_index points outside the {len(names)} names")
    steps = np.frombuffer(batch.steps, dtype="<i8")
    if n and int(steps.min()) < 0:
        raise ValueError("negative step")
    return pa.table({
        "time_ns": pa.array(np.frombuffer(batch.time_ns, dtype="<i8")),
        "job": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                              pa.array([batch.job], pa.string())),
        "rank": pa.array(np.full(n, batch.rank, dtype=np.int32)),
        "step": pa.array(steps),
        "name": pa.DictionaryArray.from_arrays(pa.array(idx), pa.array(names, pa.string())),
        "value": pa.array(np.frombuffer(batch.values, dtype="<f8")),
    })


@dataclass
class Pending:
    """One batch on its way to the store; ``done`` is set once it is stored or failed."""

    key: BatchKey
    table: pa.Table
    done: threading.Event = field(default_factory=threading.Event)
    fresh: bool = False
    error: str = ""


def _groups(pending: list[Pending]) -> Iterator[list[Pending]]:
    """``pending`` in order, cut into transactions of about ``MAX_GROUP_POINTS`` points."""
    group: list[Pending] = []
    points = 0
    for p in pending:
        if group and points >= MAX_GROUP_POINTS:
            yield group
            group, points = [], 0
        group.append(p)
        points += p.table.num_rows
    if group:
        yield group


class IngestWriter:
    """The one writer of metric batches into ``store``; see the module docstring.

    ``capacity``: batches waiting at most (each waits for its ``Push`` call, so the server's
    worker threads bound them anyway).
    """

    def __init__(self, store: MonitorStore, capacity: int = 4096) -> None:
        self.store = store
        self.points_ingested = 0
        self._queue: BackgroundQueue[Pending] = BackgroundQueue(
            self._commit, name="monitor-writer", capacity=capacity, overflow="block",
            block_timeout_s=ACK_TIMEOUT_S, start=False)

    def start(self) -> None:
        """Start the writer thread."""
        self._queue.start()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the writer thread."""
        self._queue.close(timeout)

    def write(self, key: BatchKey, table: pa.Table) -> Pending:
        """Queue one batch and wait until it is durable; ``error`` says when it is not.

        ``fresh`` is False when the store already had the batch (a resend after a lost ack).
        """
        item = Pending(key, table)
        if not self._queue.put(item):
            item.error = "the writer is behind"
        elif not item.done.wait(timeout=ACK_TIMEOUT_S):
            item.error = item.error or "timed out"
        return item

    def _commit(self, pending: list[Pending]) -> None:
        for group in _groups(pending):
            try:
                fresh = self.store.ingest([p.key for p in group], [p.table for p in group])
                for p, f in zip(group, fresh):
                    p.fresh = f
                    if f:
                        self.points_ingested += p.table.num_rows
            except Exception as e:  # noqa: BLE001 - tell every waiting caller; they resend
                for p in group:
                    p.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            finally:
                for p in group:
                    p.done.set()
