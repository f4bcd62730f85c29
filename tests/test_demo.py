"""``probe demo --no-serve``: the main job end to end finds the planted slow rank and fault."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_probe


@pytest.mark.slow
def test_demo_finds_the_slow_rank_and_the_planted_weight_fault(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "notes.txt").write_text("not the demo's")
    result = run_probe("demo", "--no-serve", "--max-steps", "14", "--out", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (out / "notes.txt").read_text() == "not the demo's"
    assert "straggler: rank 1" in result.stdout
    assert "slowest by own work: rank 1" in result.stdout
    table = [ln.split() for ln in result.stdout.splitlines() if ln.strip()[:1].isdigit() and "rank" in ln]
    named = [row[row.index("rank") + 1] for row in table]
    assert named and named.count("1") >= len(named) - 2, named
    assert "compute_time_ms" in result.stdout
    summary = json.loads((out / "compare" / "summary.json").read_text())
    counts = summary["counts"]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("compare:"))
    assert f"tensors: error {counts['tensors']['error']}" in line
    assert f"nodes: error {counts['nodes']['error']}" in line
    assert "unmatched: A 0, B 0" in line
    assert summary["unmatched_a"] == 0 and summary["unmatched_b"] == 0
    assert "decoder.layers.1.mlp.linear_fc2" in summary["first_divergence"]["b"]
    assert summary["first_nan"] is None
    trace = json.loads((out / "profile" / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert {e.get("pid") for e in events if e.get("ph") == "X"} >= {0, 1}
