"""mstx: free with no session, recorded with one, never raising on bad input, losing nothing
unless told to drop."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from probe.profiler import mstx
from probe.profiler.event_recorder import EventRecorder
from probe.profiler.range_pairing import Rows, range_ids


def record(fn):
    got = []
    rec = EventRecorder(got.extend, interval_s=0.01).start()
    try:
        fn()
    finally:
        problems = rec.stop()
    return got, problems


def test_calls_without_a_session_record_nothing_and_return_zero_ids():
    assert not mstx.is_recording()
    assert mstx.range_start("x") == 0
    assert mstx.range_end(0) is None
    assert mstx.mark("m", domain="d") is None
    with mstx.range("r"):
        pass


def test_ranges_marks_and_domains_are_recorded_with_names_kinds_and_times():
    def body():
        rid = mstx.range_start("outer", domain="engine")
        mstx.mark("hello", domain="engine")
        with mstx.range("inner"):
            pass
        mstx.domain("dataloader").range_end(mstx.domain("dataloader").range_start("fetch"))
        mstx.range_end(rid, domain="engine")

    got, problems = record(body)
    by_name = {e.name: e for e in got}
    assert set(by_name) == {"outer", "hello", "inner", "fetch"}
    assert by_name["outer"].kind == "range" and by_name["outer"].domain == "engine"
    assert by_name["hello"].kind == "mark" and by_name["hello"].start_ns == by_name["hello"].end_ns
    assert by_name["fetch"].domain == "dataloader"
    outer, inner = by_name["outer"], by_name["inner"]
    assert outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns
    assert outer.start_ns <= by_name["hello"].start_ns <= outer.end_ns
    assert not problems


def test_decorator_records_each_call_and_returns_the_result():
    @mstx.range("work", domain="user")
    def work(x):
        return x * 2

    got, _ = record(lambda: [work(i) for i in range(3)])
    assert [e.name for e in got] == ["work"] * 3
    assert work(4) == 8


def test_range_ended_on_another_thread_is_paired_and_keeps_both_threads():
    def body():
        rid = mstx.range_start("handoff")
        t = threading.Thread(target=mstx.range_end, args=(rid,))
        t.start()
        t.join()

    got, problems = record(body)
    (ev,) = got
    assert ev.name == "handoff" and ev.thread != ev.end_thread
    assert ev.thread == threading.get_ident()
    assert not problems


def test_many_threads_recording_at_once_lose_nothing():
    n_threads, n = 4, 2000
    all_done = threading.Barrier(n_threads)

    def worker():
        for i in range(n):
            mstx.range_end(mstx.range_start("w"))
        all_done.wait()          # keep every thread alive so no two share an ident

    def body():
        threads = [threading.Thread(target=worker) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    got, problems = record(body)
    assert len(got) == n_threads * n
    assert len({e.thread for e in got}) == n_threads
    assert not problems


def test_bad_input_is_counted_and_never_raises():
    class Unprintable:
        def __str__(self):
            raise ValueError("no")

    def body():
        mstx.range_end(987654321)                 # an id no range_start returned
        mstx.range_end(["not", "hashable"])       # not even an int
        rid = mstx.range_start("twice")
        mstx.range_end(rid)
        mstx.range_end(rid)                       # ended twice: the second end has no start
        mstx.range_start("never ended")
        mstx.mark(12345)                          # not a string
        mstx.mark(Unprintable())
        mstx.mark("x" * 100_000)                  # huge
        mstx.range_start(None, domain=7)          # non-string domain, never ended

    got, problems = record(body)
    assert problems["unknown_range_id"] == 2
    assert problems["unmatched_end"] == 1
    assert problems["unclosed_range"] == 2
    assert problems["non_string_message"] == 2
    assert problems["huge_message"] == 1
    names = [e.name for e in got]
    assert "12345" in names and "<unprintable Unprintable>" in names
    assert max(len(n) for n in names) < 5000


class Counting:
    """A sink that keeps how many events of each kind arrived (a million Event rows would cost
    more than recording them)."""

    def __init__(self):
        self.kinds = Counter()

    def __call__(self, batch):
        self.kinds.update(batch.kind)


def test_a_tight_loop_of_a_million_range_pairs_loses_no_event_by_default():
    # before the overflow policy this lost 21-56% of the events (200k pairs lost none): a loop
    # that does nothing but record outruns the drain, and a thread's buffer (a million records
    # by default) overflowed between two drains
    sink = Counting()
    rec = EventRecorder(sink).start()
    start, end = mstx.range_start, mstx.range_end
    for _ in range(1_000_000):
        end(start("step"))
    problems = rec.stop()
    assert sink.kinds == {"range": 1_000_000}          # every start met its end
    assert not problems


def test_a_full_buffer_makes_its_thread_wait_for_the_drain_and_loses_nothing():
    sink = Counting()
    rec = EventRecorder(sink, interval_s=0.005, max_buffer=1000).start()
    for _ in range(300_000):
        mstx.mark("m")
    problems = rec.stop()
    assert sink.kinds == {"mark": 300_000} and not problems
    assert rec.waits > 0 and rec.wait_ns > 0


def test_spool_writes_full_buffers_to_disk_and_the_drain_pairs_them_back(tmp_path):
    got = []
    rec = EventRecorder(got.extend, interval_s=60, max_buffer=100, overflow="spool",
                        spool_dir=tmp_path).start()
    for i in range(1000):
        rid = mstx.range_start(f"r{i}")
        mstx.mark(f"m{i}")
        mstx.range_end(rid)
    problems = rec.stop()
    assert not problems and rec.waits == 0
    assert rec.spilled >= 1000 and rec.spool.kept_in_memory == 0
    assert sorted(e.name for e in got if e.kind == "range") == sorted(f"r{i}" for i in range(1000))
    assert sorted(e.name for e in got if e.kind == "mark") == sorted(f"m{i}" for i in range(1000))
    assert list(tmp_path.iterdir()) == []               # the spool folder is gone


def test_drop_loses_what_overflows_a_buffer_and_counts_it():
    got = []
    rec = EventRecorder(got.extend, interval_s=60, max_buffer=100, overflow="drop").start()
    for _ in range(250):
        mstx.mark("m")
    problems = rec.stop()
    assert len(got) == 100
    assert problems["dropped_records"] == 150


def test_a_sink_that_records_with_mstx_never_makes_the_drain_wait_for_itself():
    # a thread cannot wait for a drain it is running: what overflows its buffer then is dropped
    sink, calls = Counting(), Counter()
    rec = EventRecorder(lambda batch: noisy(batch), interval_s=60, max_buffer=10).start()

    def noisy(batch):
        sink(batch)
        if threading.current_thread() is drainer:
            calls["while draining"] += 1
            for _ in range(50):
                mstx.mark("from the sink")

    def body():
        for _ in range(20):
            mstx.mark("m")
            rec.drain()

    drainer = threading.Thread(target=body)
    drainer.start()
    drainer.join(60)
    stuck = drainer.is_alive()
    problems = rec.stop()                               # (which would free a stuck thread)
    assert not stuck, "the drain waited for itself"
    assert calls["while draining"] >= 1
    assert sink.kinds["mark"] + problems["dropped_records"] == 20 + 50 * calls["while draining"]
    assert set(problems) <= {"dropped_records"}


def test_an_unknown_overflow_policy_is_refused():
    with pytest.raises(ValueError, match="block, spool, drop"):
        EventRecorder(list, overflow="wait")


def test_an_end_seen_before_its_start_in_a_later_batch_still_pairs():
    got = []
    rec = EventRecorder(got.extend, interval_s=60).start()
    holder = {}
    started = threading.Event()

    def other():
        holder["rid"] = mstx.range_start("late start")
        started.set()

    t = threading.Thread(target=other)
    t.start()
    started.wait()
    t.join()
    mstx.range_end(holder["rid"])
    # pair the main thread's records (with the end) alone first, as a drain racing a start can
    by_thread = _take_columns(rec)
    me = threading.get_ident()
    rec.pairer.pair_columns(me, *by_thread.pop(me), Rows())
    assert holder["rid"] in rec.pairer.orphan_ends
    rows = Rows()
    for tid, cols in by_thread.items():
        rec.pairer.pair_columns(tid, *cols, rows)
    got.extend(rec._finish_rows(rows, final=False))
    problems = rec.stop()
    assert [e.name for e in got] == ["late start"]
    assert not problems


def _take_columns(rec):
    """Every thread's buffered records as (codes, ids, times, f3, f4), taken out of the buffers."""
    out = {}
    if mstx._native is not None:
        for tid, codes, ids, ts, f3, f4, _dropped in mstx._native.drain():
            out[tid] = (np.frombuffer(codes, np.int8), np.frombuffer(ids, np.int64),
                        np.frombuffer(ts, np.int64), f3, f4)
        return out
    for tid, buf, _thread in rec._buffers:
        items = buf[:]
        del buf[:]
        out[tid] = (np.array([r[0] for r in items], np.int8), range_ids(items),
                    np.array([r[2] for r in items], np.int64), [r[3] for r in items],
                    [r[4] for r in items])
    return out


def test_a_forked_child_does_not_record_into_a_buffer_nobody_drains():
    import os

    got = []
    rec = EventRecorder(got.extend, interval_s=60).start()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: mstx must be off
        os.write(w, b"1" if not mstx.is_recording() and mstx.range_start("x") == 0 else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    assert mstx.is_recording()
    rec.stop()


def test_one_range_object_used_nested_and_from_threads_closes_the_right_ranges():
    shared = mstx.range("shared", domain="user")
    ready = threading.Barrier(2)

    def worker():
        with shared:
            ready.wait()
            ready.wait()

    def body():
        t = threading.Thread(target=worker)
        with shared:
            t.start()
            ready.wait()          # both threads inside the same object
            with shared:          # and nested on this thread
                pass
        ready.wait()
        t.join()

    got, problems = record(body)
    assert len(got) == 3 and all(e.thread == e.end_thread for e in got)
    inner = min(got, key=lambda e: e.end_ns - e.start_ns)
    outer = next(e for e in got if e.thread == inner.thread and e is not inner)
    assert outer.start_ns < inner.start_ns <= inner.end_ns < outer.end_ns
    assert not problems
