"""``probe simulate`` end to end: the verdicts, simulation.json, the plot and the operator table."""

from __future__ import annotations

import json

from probe.collectors.store import open_store

LLAMA_7B = 6_738_415_616


def test_7b_on_1024_ranks_gives_a_verdict_per_device_and_writes_json_plot_and_op_table(probe_cli, tmp_path):
    out = tmp_path / "sim"
    code, stdout, stderr = probe_cli("simulate", "--preset", "7b", "--nproc", "1024", "--level", "3",
                                     "--seq-len", "256", "--out", str(out))
    assert code == 0, stderr
    for device in ("H100", "H200", "A100", "910B"):
        assert any(line.strip().startswith(device) and ("fit" in line or "tight" in line)
                   for line in stdout.splitlines()), device
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["level"] == 3 and doc["params"] == LLAMA_7B
    (rank,) = doc["ranks"]
    assert rank["rank"] == 0 and rank["ranks_like"] == list(range(1024))
    assert all(isinstance(v, int) for v in rank["memory"].values())
    assert rank["memory"]["params"] == 4 * LLAMA_7B and rank["step_time_s"] > 0
    assert doc["layout"]["dp"] == 1024 and doc["step"]["mfu"] > 0
    assert (out / "memory_timeline.html").stat().st_size > 100_000
    con = open_store(str(out))
    kinds = dict(con.sql("select kind, count(*) from events where domain = 'simulate' group by kind").fetchall())
    assert kinds["kernel"] == doc["operators"]["total_ops_traced"] and kinds["comm"] >= 2


def test_level_0_gives_operators_and_the_module_tree_and_no_memory(probe_cli, tmp_path):
    out = tmp_path / "sim"
    code, stdout, _ = probe_cli("simulate", "--preset", "tiny", "--level", "0", "--out", str(out))
    assert code == 0
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["ranks"][0]["memory"] is None and doc["ranks"][0]["step_time_s"] is None
    modules = {m["name"]: m for m in doc["modules"]}
    assert modules["ReferenceLlama.layers.0.attn"]["class"] == "Attention"
    assert modules["ReferenceLlama.layers.0.attn.q_proj"]["flops"] > 0
    assert "aten.mm.default" in {op["op"] for op in doc["operators"]["top"]}
    assert not (out / "memory_timeline.html").exists()


def test_the_cpu_device_asks_for_a_calibration_first(probe_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path / "empty-cache"))
    code, _, stderr = probe_cli("simulate", "--device", "cpu", "--out", str(tmp_path / "o"))
    assert code == 2 and "probe simulate --calibrate" in stderr


def test_level_3_on_the_calibrated_cpu_times_each_op_replayed_here(probe_cli, tmp_path, calibrated_cpu):
    out = tmp_path / "sim"
    code, stdout, stderr = probe_cli("simulate", "--preset", "tiny", "--device", "cpu", "--out", str(out))
    assert code == 0, stderr
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["device"]["source"].startswith("calibrated") and doc["step"]["step_time_s"] > 0
    cpu = next(v for v in doc["verdicts"] if v["device"] == "cpu")
    assert cpu["fits"] and cpu["step_time_s"] == doc["step"]["step_time_s"]
    seconds = open_store(str(out)).sql(
        "select sum(device_end_ns - device_start_ns) from events where kind = 'kernel'").fetchall()[0][0]
    assert seconds > 0
