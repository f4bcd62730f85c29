"""Pairing of recorded range starts with their ends, one thread's batch at a time.

The recording stage (:mod:`probe.profiler.event_recorder`) hands a :class:`RangePairer` each
thread's drained records as columns (kind codes, range ids, timestamps and the two text
fields of the record layout in :mod:`probe.profiler.mstx`). It pairs them:

1. marks pass through as rows of their own;
2. ends whose id is not an int are counted as ``unknown_range_id`` and dropped;
3. within the batch, each end finds its start by id with one sorted search (ids rise within a
   thread); a second end of the same range stays unpaired;
4. starts left over wait in a dict of open ranges (or meet an end seen earlier on another
   thread); ends left over close an open range from an earlier batch or thread, or wait as
   orphans for a start not yet drained;
5. at session end (:meth:`RangePairer.finish`) open ranges count as ``unclosed_range`` and
   orphan ends as ``unmatched_end`` (an id some ``range_start`` returned) or
   ``unknown_range_id``.

Paired rows accumulate in :class:`Rows`, numpy chunks joined once per drain.

>>> import numpy as np
>>> from collections import Counter
>>> pairer, rows = RangePairer(Counter(), max_open=10), Rows()
>>> codes = np.array([1, 0, 2], dtype=np.int8)       # start, mark, end
>>> pairer.pair_columns(7, codes, np.array([5, 0, 5]), np.array([10, 12, 20]),
...                     ["work", "hello", "engine"], ["engine", "engine", None], rows)
>>> rows.name, [t.tolist() for t in rows.columns()[:2]]
(['hello', 'work'], [[12, 10], [12, 20]])
"""

from __future__ import annotations

from collections import Counter
from operator import itemgetter
from typing import Any

import numpy as np

_CODE, _ID, _TIME, _F3, _F4 = (itemgetter(i) for i in range(5))


def take(seq: tuple | list, idx: list[int]) -> tuple:
    """The items of ``seq`` at ``idx``, as a tuple.

    >>> take(("a", "b", "c"), [2, 0]), take(("a",), [])
    (('c', 'a'), ())
    """
    if len(idx) > 1:
        return itemgetter(*idx)(seq)
    return (seq[idx[0]],) if idx else ()


def range_ids(items: list) -> np.ndarray:
    """Range ids of record tuples as int64; anything that is not an int becomes -1 (unknown).

    >>> range_ids([(2, 5, 0, "", None), (2, "x", 0, "", None)]).tolist()
    [5, -1]
    """
    try:
        return np.fromiter(map(_ID, items), dtype=np.int64, count=len(items))
    except (TypeError, ValueError, OverflowError):
        return np.array([i if type(i) is int and 0 <= i < 2**62 else -1 for i in map(_ID, items)],
                        dtype=np.int64)


class Rows:
    """Columns accumulated over one drain, before filtering and step tagging.

    Timestamps and ids are kept as numpy chunks (joined once); a row's kind is derived from its
    domain except for marks, whose row spans are remembered.
    """

    __slots__ = ("domain", "name", "t0", "t1", "rid", "thread", "end_thread", "payload", "marks",
                 "_py")

    def __init__(self) -> None:
        self.domain: list = []
        self.name: list = []
        self.t0: list[np.ndarray] = []
        self.t1: list[np.ndarray] = []
        self.rid: list[np.ndarray] = []
        self.thread: list = []
        self.end_thread: list = []
        self.payload: list = []
        self.marks: list[tuple[int, int]] = []    # [start, end) row spans that are marks
        self._py: list[tuple[int, int, int]] = []  # (t0, t1, rid) of rows added one by one

    def __len__(self) -> int:
        return len(self.domain)

    def add(self, domain: Any, name: Any, t0: int, t1: int, tid: int, end_tid: int, rid: int,
            payload: dict | None) -> None:
        """One row (a range paired across batches or threads, a built-in complete range)."""
        self.domain.append(domain)
        self.name.append(name)
        self.thread.append(tid)
        self.end_thread.append(end_tid)
        self.payload.append(payload)
        self._py.append((t0, t1, rid))

    def extend(self, domain: tuple, name: tuple, t0: np.ndarray, t1: np.ndarray, rid: np.ndarray,
               tid: int, mark: bool = False) -> None:
        """Rows of one thread given as columns (``mark``: they are marks)."""
        self._flush_py()
        n = len(t0)
        if mark:
            self.marks.append((len(self.domain), len(self.domain) + n))
        self.domain.extend(domain)
        self.name.extend(name)
        self.t0.append(t0)
        self.t1.append(t1)
        self.rid.append(rid)
        self.thread.extend([tid] * n)
        self.end_thread.extend([tid] * n)
        self.payload.extend([None] * n)

    def _flush_py(self) -> None:
        if self._py:
            arr = np.array(self._py, dtype=np.int64).reshape(-1, 3)
            self.t0.append(arr[:, 0])
            self.t1.append(arr[:, 1])
            self.rid.append(arr[:, 2])
            self._py = []

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t0, t1, rid) over all rows, in row order."""
        self._flush_py()
        if not self.t0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        return np.concatenate(self.t0), np.concatenate(self.t1), np.concatenate(self.rid)


class RangePairer:
    """Pairs starts and ends across batches and threads; counts bad input in ``problems``.

    ``max_open``: open ranges kept at most (the oldest is counted as ``unclosed_range`` and
    forgotten when more are open).
    """

    def __init__(self, problems: Counter, max_open: int) -> None:
        self.problems = problems
        self.max_open = max_open
        self.open_ranges: dict[int, tuple] = {}    # range id -> (t0, message, domain, thread)
        self.orphan_ends: dict[int, tuple] = {}    # id -> (t1, domain, thread): start not seen yet

    def pair(self, tid: int, items: list, rows: Rows) -> None:
        """Pair starts and ends of one thread's batch of record tuples (the Python path)."""
        n = len(items)
        codes = np.fromiter(map(_CODE, items), dtype=np.int8, count=n)
        ts = np.fromiter(map(_TIME, items), dtype=np.int64, count=n)
        self.pair_columns(tid, codes, range_ids(items), ts, list(map(_F3, items)),
                          list(map(_F4, items)), rows)

    def pair_columns(self, tid: int, codes: np.ndarray, ids: np.ndarray, ts: np.ndarray,
                     f3: list, f4: list, rows: Rows) -> None:
        """Pair starts and ends of one thread's batch given as columns; marks pass through."""
        s_idx = np.flatnonzero(codes == 1)
        e_idx = np.flatnonzero(codes == 2)
        m_idx = np.flatnonzero(codes == 0)
        if len(m_idx):
            m = m_idx.tolist()
            t = ts[m_idx]
            rows.extend(take(f4, m), take(f3, m), t, t, ids[m_idx], tid, mark=True)
        if len(e_idx):
            bad = ids[e_idx] < 0
            if bad.any():
                self.problems["unknown_range_id"] += int(bad.sum())
                e_idx = e_idx[~bad]
        s_ids, e_ids = ids[s_idx], ids[e_idx]
        used = np.zeros(len(s_idx), dtype=bool)
        hit = np.zeros(len(e_idx), dtype=bool)
        if len(s_idx) and len(e_idx):
            pos = np.minimum(np.searchsorted(s_ids, e_ids), len(s_ids) - 1)
            hit = s_ids[pos] == e_ids
            hit_pos = pos[hit]
            used[hit_pos] = True
            if np.count_nonzero(used) < len(hit_pos):   # a range ended twice in this batch
                first = np.unique(hit_pos, return_index=True)[1]
                keep = np.zeros(len(hit_pos), dtype=bool)
                keep[first] = True
                hit[np.flatnonzero(hit)[~keep]] = False
                hit_pos = hit_pos[keep]
            sm, em = s_idx[hit_pos], e_idx[hit]
            if len(sm):
                s_list, e_list = sm.tolist(), em.tolist()
                domains = take(f4, s_list)
                end_domains = take(f3, e_list)
                if domains != end_domains:
                    self.problems["end_domain_differs"] += sum(a != b for a, b in zip(domains, end_domains))
                rows.extend(domains, take(f3, s_list), ts[sm], ts[em], ids[sm], tid)
        opened, orphans = self.open_ranges, self.orphan_ends
        for i in s_idx[~used].tolist():                  # still open, or ended on another thread
            rid = int(ids[i])
            end = orphans.pop(rid, None) if orphans else None
            if end is None:
                if len(opened) >= self.max_open:
                    self.problems["unclosed_range"] += 1
                    opened.pop(next(iter(opened)))
                opened[rid] = (int(ts[i]), f3[i], f4[i], tid)
            else:
                rows.add(f4[i], f3[i], int(ts[i]), end[0], tid, end[2], rid, None)
        for i in e_idx[~hit].tolist():                   # started in an earlier batch or thread
            rid = int(ids[i])
            start = opened.pop(rid, None)
            if start is None:
                if rid in orphans:
                    self.problems["unmatched_end"] += 1
                orphans[rid] = (int(ts[i]), f3[i], tid)
                continue
            t0, message, domain, stid = start
            if domain != f3[i]:
                self.problems["end_domain_differs"] += 1
            rows.add(domain, message, t0, int(ts[i]), stid, tid, rid, None)

    def finish(self, first_id: int, last_id: int) -> None:
        """Session end: count what never balanced (ids in ``(first_id, last_id)`` were handed
        out during the session, so an orphan end with one had its start lost or ended twice)."""
        if self.open_ranges:
            self.problems["unclosed_range"] += len(self.open_ranges)
            self.open_ranges.clear()
        for rid in self.orphan_ends:
            if first_id < rid < last_id:
                self.problems["unmatched_end"] += 1
            else:
                self.problems["unknown_range_id"] += 1
        self.orphan_ends.clear()
