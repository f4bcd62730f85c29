"""The C recording path of mstx: same behaviour as the Python path, which still works without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from probe.profiler import mstx
from probe.profiler.event_recorder import EventRecorder

ROOT = Path(__file__).resolve().parents[2]
native = pytest.mark.skipif(mstx._native is None, reason="profiler._mstx_native is not built")


def record(fn, **kw):
    got = []
    rec = EventRecorder(got.extend, interval_s=60, **kw).start()
    try:
        fn()
    finally:
        problems = rec.stop()
    return got, problems, rec


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler: the install cannot build the extension")
def test_the_install_built_the_extension_and_mstx_uses_it():
    assert mstx._native is not None
    assert mstx.range_start is mstx._native.range_start
    assert mstx.mark is mstx._native.mark


@native
def test_keyword_calls_timestamps_and_thread_names():
    def body():
        before = time.perf_counter_ns()
        rid = mstx.range_start(message="kw", domain="engine")
        mstx.range_end(range_id=rid, domain="engine")
        mstx.mark("m", None, "d")
        after = time.perf_counter_ns()
        body.window = (before, after)
        t = threading.Thread(target=lambda: mstx.mark("from worker"), name="worker-7")
        t.start()
        t.join()

    got, problems, rec = record(body)
    assert not problems
    by_name = {e.name: e for e in got}
    kw, m = by_name["kw"], by_name["m"]
    assert (kw.domain, kw.kind, m.domain, m.kind) == ("engine", "range", "d", "mark")
    lo, hi = body.window
    assert lo <= kw.start_ns <= kw.end_ns <= m.start_ns <= hi      # the perf_counter_ns clock
    assert rec.thread_names[by_name["from worker"].thread] == "worker-7"


@native
def test_wrong_signatures_raise_like_python_functions_and_record_nothing():
    def body():
        for call in (lambda: mstx.range_start(), lambda: mstx.range_start("a", None, "d", 4),
                     lambda: mstx.range_start("a", message="b"), lambda: mstx.mark("a", colour=1),
                     lambda: mstx.range_end(), lambda: mstx.range_end(1, "d", 3)):
            with pytest.raises(TypeError):
                call()

    got, problems, _ = record(body)
    assert got == [] and not problems


@native
def test_ids_that_are_not_small_non_negative_ints_are_unknown_and_falsy_ones_ignored():
    def body():
        mstx.range_end(2**70)
        mstx.range_end(-3)
        mstx.range_end("abc")
        mstx.range_end(None)
        mstx.range_end("")
        mstx.range_end(0)

    got, problems, _ = record(body)
    assert problems["unknown_range_id"] == 3
    assert got == []


@native
def test_a_call_given_a_stream_takes_the_python_path_into_the_same_buffer():
    class NotAStream:
        device = None

    def body():
        rid = mstx.range_start("on stream", stream=NotAStream())      # no device event possible
        mstx.mark("plain")
        mstx.range_end(rid)

    got, problems, _ = record(body)
    assert sorted(e.name for e in got) == ["on stream", "plain"]
    assert all(e.device_start_ns is None for e in got)
    assert mstx._streams == {}


@native
def test_records_from_a_finished_session_never_reach_the_next_one():
    got1, _, _ = record(lambda: mstx.mark("first"))
    got2, _, _ = record(lambda: mstx.mark("second"))
    assert [e.name for e in got1] == ["first"] and [e.name for e in got2] == ["second"]


def test_the_python_path_passes_the_mstx_suite_without_the_extension():
    env = {**os.environ, "PROBE_NATIVE": "0"}
    probe = subprocess.run([sys.executable, "-c", "from probe.profiler import mstx; print(mstx._native)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "None", probe.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/profiler/test_mstx.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
