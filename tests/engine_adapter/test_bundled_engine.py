"""The bundled engine: two implementations that agree, rank-count invariance, planted faults."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from probe.engine.config import PRESETS, get_preset
from probe.engine.data import make_batch
from probe.engine.launch import run_training
from probe.engine.models import build_model, init_reference_state
from probe.engine.spec import RunSpec
from probe.ground.errors import ProbeError


def _loss(engine: str, state, cfg, tokens, targets) -> float:
    model = build_model(engine, cfg)
    model.load_reference_state(state)
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()


@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_reference_and_fused_agree_on_loss_with_the_same_weights(preset):
    cfg = get_preset(preset)
    state = init_reference_state(cfg, seed=3)
    tokens, targets = make_batch(cfg, step=0, rank=0, world_size=1, seed=3)
    ref, fused = _loss("reference", state, cfg, tokens, targets), _loss("fused", state, cfg, tokens, targets)
    assert math.isfinite(ref)
    assert abs(ref - fused) / abs(ref) < 1e-4


def test_fused_weights_round_trip_to_the_reference_format():
    cfg = get_preset("tiny")
    state = init_reference_state(cfg, seed=1)
    fused = build_model("fused", cfg)
    fused.load_reference_state(state)
    back = fused.reference_state()
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_fused_engine_uses_its_own_module_names():
    names = {n for n, _ in build_model("fused", get_preset("tiny")).named_modules()}
    assert "decoder.layers.0.self_attention.linear_qkv" in names
    assert not any("q_proj" in n for n in names)


def test_training_two_ranks_matches_one_rank_with_the_same_global_batch(tmp_path):
    one = run_training(RunSpec(preset="tiny", nproc=1, max_steps=4, out_dir=str(tmp_path / "one"), quiet=True))
    two = run_training(RunSpec(preset="tiny", nproc=2, max_steps=4, out_dir=str(tmp_path / "two"), quiet=True))
    assert [r["ranks"] for r in two.steps] == [2, 2, 2, 2]
    for a, b in zip(one.steps, two.steps):
        assert abs(a["loss"] - b["loss"]) / abs(a["loss"]) < 1e-4


def test_reference_and_fused_training_runs_agree_over_steps(tmp_path):
    ref = run_training(RunSpec(engine="reference", max_steps=3, out_dir=str(tmp_path / "r"), quiet=True))
    fus = run_training(RunSpec(engine="fused", max_steps=3, out_dir=str(tmp_path / "f"), quiet=True))
    for a, b in zip(ref.steps, fus.steps):
        assert abs(a["loss"] - b["loss"]) / abs(a["loss"]) < 1e-4


def test_loss_falls_when_training_longer(tmp_path):
    result = run_training(RunSpec(preset="tiny", max_steps=20, lr=1e-2, out_dir=str(tmp_path), quiet=True))
    assert result.steps[-1]["loss"] < result.steps[0]["loss"] - 0.5


def test_nan_fault_poisons_the_loss_from_its_step(tmp_path):
    result = run_training(RunSpec(max_steps=3, faults=("nan:layers.1.mlp:1",), out_dir=str(tmp_path), quiet=True))
    losses = [r["loss"] for r in result.steps]
    assert math.isfinite(losses[0]) and math.isnan(losses[1])


def test_scale_fault_changes_the_loss_of_the_first_step(tmp_path):
    base = run_training(RunSpec(max_steps=1, out_dir=str(tmp_path / "a"), quiet=True))
    hit = run_training(RunSpec(max_steps=1, faults=("scale:lm_head.weight:20",), out_dir=str(tmp_path / "b"),
                               quiet=True))
    assert abs(hit.steps[0]["loss"] - base.steps[0]["loss"]) > 0.1


def test_slow_fault_slows_only_its_rank(tmp_path):
    run_training(RunSpec(nproc=2, max_steps=3, faults=("slow:1:4",), out_dir=str(tmp_path), quiet=True))
    from probe.collectors.store import open_store
    rows = dict(open_store(tmp_path).sql(
        "select rank, median(value) from metrics where name='compute_time_ms' and step > 0 group by rank").fetchall())
    assert rows[1] > 2.0 * rows[0]


@pytest.mark.parametrize("spec, words", [
    (RunSpec(preset="huge"), "valid presets"),
    (RunSpec(nproc=3), "divide"),
    (RunSpec(nproc=0), "--nproc"),
    (RunSpec(faults=("explode:x:1",)), "valid forms"),
    (RunSpec(faults=("slow:4:2",), nproc=2), "does not exist"),
    (RunSpec(faults=("scale:nope.weight:2",)), "no parameter"),
    (RunSpec(engine="jax"), "valid engines"),
])
def test_bad_run_options_give_a_one_line_error(tmp_path, spec, words):
    from dataclasses import replace
    with pytest.raises(ProbeError) as err:
        run_training(replace(spec, out_dir=str(tmp_path), max_steps=1, quiet=True))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_presets_cover_tests_demos_and_gpus():
    assert get_preset("tiny").n_params() < 1e6
    assert 20e6 < get_preset("small").n_params() < 35e6
    assert max(c.n_params() for c in PRESETS.values()) > 1e9


def test_a_ranks_intra_op_threads_follow_omp_num_threads_set_after_torch_loaded(monkeypatch):
    """OMP_NUM_THREADS from a run's extra environment reaches the rank after torch has loaded
    (OpenMP read the environment already), so the rank sets it explicitly."""
    import os

    from probe.engine.train import _intra_op_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _intra_op_threads(4) == 1 and _intra_op_threads(1) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert _intra_op_threads(4) == max(1, (os.cpu_count() or 1) // 4)
    assert _intra_op_threads(1) is None
