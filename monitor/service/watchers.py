"""Live events (alerts, trace requests, trace files) fanned out to every ``Watch`` stream.

Each watcher has its own bounded queue; one that does not read loses events, never slows the
service.

>>> watchers = Watchers()
>>> with watchers.watching() as events:
...     watchers.broadcast({"type": "alert", "job": "j"})
...     events.get_nowait()["type"]
'alert'
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Iterator

#: Events kept for a watcher that has not read them yet; more are dropped for it.
WATCHER_BACKLOG = 10_000


class Watchers:
    """The queues of the open ``Watch`` streams; see the module docstring."""

    def __init__(self) -> None:
        self._queues: list[queue.Queue] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def watching(self) -> Iterator["queue.Queue[dict[str, Any]]"]:
        """A queue that receives every event broadcast while the block runs."""
        q: queue.Queue = queue.Queue(maxsize=WATCHER_BACKLOG)
        with self._lock:
            self._queues.append(q)
        try:
            yield q
        finally:
            with self._lock:
                self._queues.remove(q)

    def broadcast(self, event: dict[str, Any]) -> None:
        """Give ``event`` to every watcher (not to one whose backlog is full)."""
        with self._lock:
            queues = list(self._queues)
        for q in queues:
            try:
                q.put_nowait(event)
            except queue.Full:          # a watcher that does not read loses events, not the service
                pass
