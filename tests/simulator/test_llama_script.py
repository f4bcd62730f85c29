"""A user's 7B Llama (a Hugging Face-style config, no weights, plain torch) simulated unchanged."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from probe.simulator.layout import make_layout
from probe.simulator.script_workload import trace_script
from probe.simulator.simulation import simulate

SCRIPT = Path(__file__).parent / "scripts" / "train_llama.py"
LLAMA_7B = 6_738_415_616


def test_the_7b_llama_script_runs_unchanged_with_its_exact_parameters_and_model_states(probe_cli, tmp_path):
    out = tmp_path / "llama"
    code, stdout, stderr = probe_cli("simulate", "--nproc", "8", "--zero", "2", "--level", "1",
                                     "--max-steps", "1", "--out", str(out), "--", str(SCRIPT), "--seq", "64")
    assert code == 0, stderr
    assert "model: 6.74B parameters" in stdout
    doc = json.loads((out / "simulation.json").read_text())
    assert doc["params"] == LLAMA_7B
    memory = doc["ranks"][0]["memory"]
    tensors = 3 + 9 * 32                                        # embed, norm, head; 9 per layer
    assert memory["params"] == 4 * LLAMA_7B                    # fp32, whole on every rank
    assert memory["grads"] == 4 * LLAMA_7B // 8                # ZeRO-2: a 1/8 shard
    assert memory["optimizer"] == (8 * LLAMA_7B + 4 * tensors) // 8
    assert len(doc["ranks"][0]["ranks_like"]) == 8


def _trace_small_llama(nproc: int):
    argv = [str(SCRIPT), "--size", "tiny", "--seq", "32"]

    def run() -> int:
        saved = sys.argv
        sys.argv = argv
        try:
            runpy.run_path(str(SCRIPT), run_name="__main__")
        finally:
            sys.argv = saved
        return 0

    return trace_script(run, str(SCRIPT), max_steps=2, layout=make_layout(nproc=nproc, global_batch=nproc))[0]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_states_per_rank_follow_the_zero_formula(zero):
    traced = _trace_small_llama(4)
    n = traced.params
    tensors = 3 + 9 * 2
    memory = simulate(traced, make_layout(nproc=4, zero=zero, global_batch=4), level=1,
                      device="H100").as_json()["ranks"][0]["memory"]
    assert memory["params"] == (4 * n // 4 if zero == 3 else 4 * n)
    assert memory["grads"] == (4 * n // 4 if zero >= 2 else 4 * n)
    assert memory["optimizer"] == ((8 * n + 4 * tensors) // 4 if zero >= 1 else 8 * n + 4 * tensors)
