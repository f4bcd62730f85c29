"""Full ``mstx`` buffers kept on disk until the drain takes them (the ``spool`` overflow policy).

Under ``overflow="spool"`` a thread whose buffer is full hands the whole buffer to
:meth:`Spool.write` (on its own thread, as :mod:`probe.ground.background` spills) and goes on recording
into an empty one; the recorder's drain takes the chunks back with :meth:`Spool.take`, oldest
first, before the buffers still in memory, so a thread's records are paired in the order they
were made. A chunk is what :func:`probe.profiler._mstx_native.drain` yields for one thread, or
``(thread id, record tuples)`` from the pure-Python path. Nothing is ever lost: a chunk that
cannot be written (a full disk, a message object that cannot be pickled) is kept in memory
instead, and counted in :attr:`Spool.kept_in_memory`.

>>> s = Spool()
>>> s.write((7, [(0, 0, 10, "tick", "default")]))
>>> s.take(), s.take(), s.records
((7, [(0, 0, 10, 'tick', 'default')]), None, 1)
>>> s.close()
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import tempfile
import threading
from collections import deque
from typing import Any


class Spool:
    """Chunks of raw records in files of a private temporary folder under ``folder`` (default:
    the system's temporary folder), removed by :meth:`close`."""

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        self.folder = folder
        self.records = 0                 # records handed to write(), ever
        self.kept_in_memory = 0          # chunks that could not be written to disk
        self._dir: str | None = None
        self._ready: deque[tuple[str | None, Any]] = deque()   # (file, None) or (None, chunk)
        self._names = itertools.count()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ready)

    def write(self, chunk: tuple) -> None:
        """Keep ``chunk`` until :meth:`take`; never raises (the hot path's caller runs this)."""
        size = len(chunk[1])             # its record tuples, or its bytes of kind codes
        try:
            with self._lock:
                if self._dir is None:
                    self._dir = tempfile.mkdtemp(prefix="probe-mstx-spool-", dir=self.folder)
                path = os.path.join(self._dir, f"{next(self._names):08d}.pkl")
            with open(path, "wb") as fh:
                pickle.dump(chunk, fh, protocol=pickle.HIGHEST_PROTOCOL)
            self._ready.append((path, None))
        except Exception:  # noqa: BLE001 - a full disk or an unpicklable message: keep it in memory
            self.kept_in_memory += 1
            self._ready.append((None, chunk))
        self.records += size

    def take(self) -> tuple | None:
        """The oldest chunk not yet taken (None when there is none); its file is removed."""
        try:
            path, chunk = self._ready.popleft()
        except IndexError:
            return None
        if path is None:
            return chunk
        with open(path, "rb") as fh:
            chunk = pickle.load(fh)
        os.remove(path)
        return chunk

    def close(self) -> None:
        """Forget what is left and remove the folder."""
        self._ready.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

