"""Parallel layouts: impossible ones are one-line errors; each rank holds what its layout gives it."""

from __future__ import annotations

import pytest

from probe.simulator.engine_workload import trace_engine
from probe.simulator.layout import make_layout
from probe.simulator.simulation import simulate

TINY_PARAMS = 131904


@pytest.mark.parametrize("args, words", [
    (["--tp", "3"], "--tp 3 does not divide the model's 4 heads"),
    (["--nproc", "6", "--dp", "4"], "--nproc 6 is not --dp 4 x --tp 1 x --pp 1 = 4"),
    (["--nproc", "6", "--tp", "4"], "--nproc 6 does not split into --tp 4"),
    (["--pp", "3"], "--pp 3 does not divide the model's 2 layers"),
    (["--zero", "4"], "'--zero': 4 is not in the range 0<=x<=3"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--device", "tpu"], "--device tpu: unknown device"),
])
def test_an_impossible_layout_is_one_line_and_exit_2(probe_cli, tmp_path, args, words):
    code, out, err = probe_cli("simulate", "--out", str(tmp_path / "o"), *args)
    assert code == 2
    assert words in err and len(err.strip().splitlines()) == 1


def test_tensor_and_pipeline_options_are_refused_for_a_script(probe_cli, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import torch\n")
    code, _, err = probe_cli("simulate", "--tp", "2", "--out", str(tmp_path / "o"), "--", str(script))
    assert code == 2 and "apply to the bundled engine" in err


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_shard_model_states_over_data_parallel_ranks(zero):
    lay = make_layout(nproc=4, zero=zero, global_batch=8)
    memory = simulate(trace_engine("tiny", "reference", "float32", lay), lay, level=1,
                      device="H100").as_json()["ranks"][0]["memory"]
    full = 4 * TINY_PARAMS
    assert memory["params"] == (full // 4 if zero == 3 else full)
    # the engine's gradient bucket also holds one float32 loss slot per rank (its losses ride in
    # the gradients' all-reduce, so every rank sees a NaN loss at once): real bytes, counted
    bucket = full + 4 * 4
    assert memory["grads"] == (bucket // 4 if zero >= 2 else bucket)
    adam = 2 * full + 4 * 21                                  # exp_avg, exp_avg_sq, 21 step counters
    assert memory["optimizer"] == (adam // 4 if zero >= 1 else adam)


def test_pipeline_stages_hold_their_layers_and_the_microbatches_in_flight():
    lay = make_layout(nproc=16, tp=2, pp=2, global_batch=16)     # dp 4, 4 microbatches of 1
    doc = simulate(trace_engine("tiny", "reference", "float32", lay), lay, level=1, device="H100").as_json()
    first, last = doc["ranks"]
    assert first["ranks_like"] == list(range(8)) and last["ranks_like"] == list(range(8, 16))
    # stage 0: the embedding's vocab/tp rows and one layer; stage 1: a layer, the norm and LM head
    layer = 4 * 64 * 64 // 2 + 3 * 64 * 172 // 2 + 2 * 64
    assert first["memory"]["params"] == 4 * (256 * 64 // 2 + layer)
    assert last["memory"]["params"] == 4 * (layer + 64 + 64 * 256 // 2)
    # 1F1B: stage 0 keeps two microbatches' activations while the last stage keeps one
    assert first["memory"]["activations"] > last["memory"]["activations"]
    assert doc["params"] == TINY_PARAMS


def test_thousands_of_ranks_are_computed_once_per_distinct_stage():
    lay = make_layout(nproc=8192, tp=4, pp=2, zero=1, global_batch=1024)
    doc = simulate(trace_engine("tiny", "reference", "bfloat16", lay), lay, level=3, device="H100").as_json()
    assert [len(r["ranks_like"]) for r in doc["ranks"]] == [4096, 4096]
    assert all(r["step_time_s"] > 0 for r in doc["ranks"])
    assert {v["device"] for v in doc["verdicts"]} >= {"H100", "H200", "A100", "910B"}
