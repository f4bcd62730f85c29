"""ground.background: the one bounded queue with a worker thread, and its three overflow policies."""

from __future__ import annotations

import threading
import time

import pytest

from probe.ground.background import BackgroundQueue


def _gated():
    """A handle that waits on a gate, so the queue fills while the worker is stuck."""
    gate = threading.Event()
    seen: list[int] = []

    def handle(batch):
        gate.wait(10)
        seen.extend(batch)

    return gate, seen, handle


def test_items_reach_handle_in_order_and_flush_waits_for_them():
    seen: list[int] = []
    q = BackgroundQueue(lambda b: (time.sleep(0.001), seen.extend(b)), name="t", capacity=8)
    for i in range(500):
        assert q.put(i)
    assert q.flush(10)
    assert seen == list(range(500)) and q.dropped == 0 and q.handled == 500
    assert q.close(5)


def test_block_policy_makes_the_caller_wait_and_loses_nothing():
    gate, seen, handle = _gated()
    q = BackgroundQueue(handle, name="t", capacity=2, overflow="block")
    q.put(0)
    time.sleep(0.05)                       # the worker holds item 0 in handle
    q.put(1), q.put(2)                     # the queue is full now
    t = threading.Thread(target=q.put, args=(3,))
    t.start()
    time.sleep(0.1)
    assert t.is_alive(), "put on a full 'block' queue returned before there was room"
    gate.set()
    t.join(5)
    q.close(5)
    assert seen == [0, 1, 2, 3] and q.dropped == 0


def test_block_policy_with_a_timeout_counts_what_it_gave_up():
    gate, seen, handle = _gated()
    q = BackgroundQueue(handle, name="t", capacity=1, overflow="block", block_timeout_s=0.05)
    q.put(0)
    time.sleep(0.05)
    q.put(1)
    assert q.put(2) is False and q.dropped == 1
    gate.set()
    q.close(5)
    assert seen == [0, 1]


def test_drop_policy_counts_every_dropped_item():
    gate, seen, handle = _gated()
    q = BackgroundQueue(handle, name="t", capacity=3, overflow="drop")
    q.put(0)
    time.sleep(0.05)
    accepted = sum(q.put(i) for i in range(1, 11))
    gate.set()
    q.close(5)
    assert accepted == 3 and q.dropped == 7 and seen == [0, 1, 2, 3]


def test_spool_policy_hands_overflow_to_spill_and_loses_nothing():
    gate, seen, handle = _gated()
    spilled: list[int] = []
    q = BackgroundQueue(handle, name="t", capacity=2, overflow="spool", spill=spilled.append)
    q.put(0)
    time.sleep(0.05)
    for i in range(1, 8):
        q.put(i)
    gate.set()
    q.close(5)
    assert sorted(seen + spilled) == list(range(8)) and q.spilled == len(spilled) == 5


def test_a_failing_handle_is_reported_and_the_worker_goes_on():
    errors: list[BaseException] = []
    seen: list[int] = []

    def handle(batch):
        if 1 in batch:
            raise ValueError("bad item")
        seen.extend(batch)

    q = BackgroundQueue(handle, name="t", capacity=4, max_batch=1, on_error=errors.append)
    for i in range(3):
        q.put(i)
    q.close(5)
    assert seen == [0, 2] and [str(e) for e in errors] == ["bad item"]


def test_interval_wakes_the_worker_with_an_empty_batch():
    calls: list[int] = []
    q = BackgroundQueue(lambda b: calls.append(len(b)), name="t", interval_s=0.01)
    time.sleep(0.2)
    q.close(5)
    assert calls.count(0) >= 3



def test_a_wake_while_the_worker_is_busy_is_not_lost():
    """A ticking worker busy in its handle when wake() comes takes the next batch at once,
    not a whole interval later."""
    started, release, calls = threading.Event(), threading.Event(), []

    def handle(batch):
        calls.append(time.monotonic())
        if len(calls) == 1:
            started.set()
            release.wait(5)

    q = BackgroundQueue(handle, name="t", interval_s=60.0)
    q.wake()                                  # the first tick, now
    assert started.wait(5)
    q.wake()                                  # while the worker is busy in handle
    woke = time.monotonic()
    release.set()
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    q.close(5)
    assert len(calls) >= 2 and calls[1] - woke < 2.0

def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="overflow"):
        BackgroundQueue(list, name="t", overflow="lose")          # type: ignore[arg-type]
    with pytest.raises(ValueError, match="spill"):
        BackgroundQueue(list, name="t", overflow="spool")
