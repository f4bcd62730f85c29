import json

import pytest

from probe.ground.errors import ProbeError
from probe.visualizer.timeline import load_trace_spans


def test_chrome_trace_complete_and_begin_end_events_become_spans_on_named_lanes(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 1"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main"}},
        {"ph": "X", "name": "step 0", "cat": "step", "pid": 1, "tid": 7, "ts": 1000.0, "dur": 500.0},
        {"ph": "B", "name": "all_reduce", "cat": "communication", "pid": 1, "tid": 7, "ts": 1100.0},
        {"ph": "E", "pid": 1, "tid": 7, "ts": 1300.0},
        {"ph": "i", "name": "ckpt", "pid": 0, "tid": 1, "ts": 1200.0},
    ]}))
    spans = load_trace_spans(trace)
    by_name = {s.name: s for s in spans}
    assert by_name["step 0"].lane == "rank 1 · main" and by_name["step 0"].start_us == 0.0
    assert by_name["all_reduce"].dur_us == 200.0 and by_name["all_reduce"].cat == "communication"
    assert by_name["ckpt"].dur_us == 0.0 and by_name["ckpt"].lane == "pid 0 · tid 1"


def test_a_broken_trace_is_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "trace.json"
    bad.write_text("{")
    with pytest.raises(ProbeError, match="trace.json: invalid trace JSON"):
        load_trace_spans(bad)
    bad.write_text('{"x": 1}')
    with pytest.raises(ProbeError, match="no traceEvents"):
        load_trace_spans(bad)
