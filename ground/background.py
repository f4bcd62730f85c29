"""One bounded queue drained by one background thread: the batching stage of every writer.

The hot path (a training step, a hook, an ``mstx`` call) hands work to :meth:`BackgroundQueue.put`
and returns; a worker thread takes everything waiting, in order, and passes it to ``handle`` as
one list. ``handle`` is never called on the caller's thread and never twice at once. What the
queue does when it is full is one choice, made by its owner:

- ``"block"``: the caller waits for room (``block_timeout_s`` at most; after that the item is
  counted in :attr:`dropped`). A disk slower than training for good makes training wait
  instead of holding unbounded memory.
- ``"spool"``: the item goes to ``spill(item)`` on the caller's thread (to disk, say) and is
  counted in :attr:`spilled`; nothing is lost.
- ``"drop"``: the item is counted in :attr:`dropped` and let go; the owner reports the count.

With ``interval_s`` the worker also wakes that often with nothing new and calls
``handle([])`` (a heartbeat, a periodic drain of buffers that live elsewhere); a put then does
not wake it (it takes what waits at its next tick: a batch, and no context switch per item),
while :meth:`flush` and :meth:`close` do.
A ``handle`` that raises is reported to ``on_error`` and the worker goes on.

>>> seen = []
>>> q = BackgroundQueue(seen.extend, name="example", capacity=4)
>>> for i in range(10):
...     _ = q.put(i)
>>> q.flush()
True
>>> seen == list(range(10)), q.dropped
(True, 0)
>>> q.close()
True
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Generic, Literal, TypeVar

T = TypeVar("T")
Overflow = Literal["block", "spool", "drop"]
OVERFLOW_POLICIES: tuple[str, ...] = ("block", "spool", "drop")


class BackgroundQueue(Generic[T]):
    """A bounded FIFO with one worker thread; see the module docstring.

    ``capacity``: items waiting at most; ``max_batch``: items handed to one ``handle`` call at
    most (None: all that wait); ``daemon``: the worker does not keep the process alive (call
    :meth:`close` to finish the work).
    """

    def __init__(self, handle: Callable[[list[T]], None], *, name: str, capacity: int = 1024,
                 overflow: Overflow = "block", spill: Callable[[T], None] | None = None,
                 block_timeout_s: float | None = None, interval_s: float | None = None,
                 max_batch: int | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 daemon: bool = True, start: bool = True) -> None:
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow {overflow!r}: use one of {', '.join(OVERFLOW_POLICIES)}")
        if overflow == "spool" and spill is None:
            raise ValueError("overflow 'spool' needs a spill function")
        if capacity < 1:
            raise ValueError(f"capacity {capacity}: use 1 or more")
        self.handle = handle
        self.name = name
        self.capacity = int(capacity)
        self.overflow: Overflow = overflow
        self.spill = spill
        self.block_timeout_s = block_timeout_s
        self.interval_s = interval_s
        self.max_batch = max_batch
        self.on_error = on_error
        self.dropped = 0
        self.spilled = 0
        self.handled = 0
        self._items: deque[T] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._worker_waiting = False     # the worker sleeps on the condition: a put must wake it
        self._wake_pending = False       # a wake() while the worker was busy: its next wait is skipped
        self._callers_waiting = 0        # callers blocked on a full queue: a take must wake them
        self._put_total = 0          # items accepted into the queue, ever
        self._done_total = 0         # of those, handed to ``handle`` and returned
        self._closing = False
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=daemon)
        if start:
            self._thread.start()

    # --- the caller's side --------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    @property
    def busy(self) -> bool:
        """Items wait, or ``handle`` is running."""
        return bool(self._items) or self._busy

    def put(self, item: T) -> bool:
        """Queue ``item``; False when the overflow policy did not queue it (spilled or dropped)."""
        with self._cond:
            if self._closing:
                raise RuntimeError(f"{self.name}: put after close")
            if len(self._items) >= self.capacity:
                if self.overflow == "drop":
                    self.dropped += 1
                    return False
                if self.overflow == "spool":
                    self.spilled += 1
                    spill = self.spill
                else:
                    spill = None
                    deadline = (None if self.block_timeout_s is None
                                else time.monotonic() + self.block_timeout_s)
                    while len(self._items) >= self.capacity and not self._closing:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            self.dropped += 1
                            return False
                        self._callers_waiting += 1
                        try:
                            self._cond.wait(left)
                        finally:
                            self._callers_waiting -= 1
            if len(self._items) < self.capacity or self.overflow == "block":
                self._items.append(item)
                self._put_total += 1
                if self._worker_waiting and self.interval_s is None:
                    self._cond.notify_all()
                return True
        assert spill is not None
        spill(item)                      # outside the lock: it may write to disk
        return False

    def wake(self) -> None:
        """Make a worker that waits for its next tick take what is queued now (a worker busy
        at that moment does not wait for its next tick either: the wake is kept for it)."""
        with self._cond:
            self._wake_pending = True
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every item queued so far was handled; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._put_total
            self._cond.notify_all()          # a worker between ticks: take it now
            while self._done_total < target:
                if not self._thread.is_alive():
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 0.5)
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Handle what is queued, stop the worker; True when it finished in ``timeout``."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def start(self) -> None:
        """Start the worker (when built with ``start=False``)."""
        self._thread.start()

    # --- the worker ---------------------------------------------------------------------
    def _take(self) -> tuple[list[T], bool]:
        with self._cond:
            if not self._items and not self._closing and not self._wake_pending:
                self._worker_waiting = True
                try:
                    self._cond.wait(self.interval_s)
                finally:
                    self._worker_waiting = False
            self._wake_pending = False
            n = len(self._items) if self.max_batch is None else min(self.max_batch, len(self._items))
            batch = [self._items.popleft() for _ in range(n)]
            finished = self._closing and not self._items
            self._busy = bool(batch) or self.interval_s is not None
            if batch and self._callers_waiting:
                self._cond.notify_all()       # room for blocked callers
            return batch, finished

    def _run(self) -> None:
        while True:
            batch, finished = self._take()
            try:
                if batch or self.interval_s is not None:
                    self.handle(batch)
            except BaseException as e:  # noqa: BLE001 - the worker outlives a failing handle
                if self.on_error is not None:
                    self.on_error(e)
            finally:
                with self._cond:
                    self._busy = False
                    self._done_total += len(batch)
                    self.handled += len(batch)
                    self._cond.notify_all()
            if finished:
                return
