"""FLOPs by dispatch: a hand count of the bundled engine, recomputation, MFU/HFU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from probe.engine.config import get_preset
from probe.engine.models import build_model, init_reference_state
from probe.engine_adapter.base import get_adapter
from probe.engine_adapter.steps import StepSource
from probe.profiler.engine_callbacks import FlopsCallback
from probe.profiler.flops import FlopCounter, peak_flops, utilisation


def hand_count(cfg, batch: int) -> int:
    """6 N T for the matmul parameters plus 12 L s d T for attention scores and values."""
    d, h, v, L, s = cfg.d_model, cfg.ffn_hidden, cfg.vocab_size, cfg.n_layers, cfg.seq_len
    n_matmul = L * (4 * d * d + 3 * d * h) + v * d      # q k v o, gate up down, lm head
    tokens = batch * s
    return 6 * n_matmul * tokens + 12 * L * s * d * tokens


def train_step_flops(engine: str, cfg, batch: int) -> FlopCounter:
    torch.manual_seed(0)
    model = build_model(engine, cfg)
    model.load_reference_state(init_reference_state(cfg, seed=0))
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    with FlopCounter() as fc:
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)).backward()
    return fc


@pytest.mark.parametrize("engine", ["reference", "fused"])
@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_model_flops_of_a_training_step_match_the_hand_count_within_2_percent(engine, preset):
    cfg = get_preset(preset)
    fc = train_step_flops(engine, cfg, batch=2)
    expected = hand_count(cfg, batch=2)
    assert abs(fc.model_flops - expected) / expected < 0.02
    assert fc.hardware_flops >= fc.model_flops


def test_fused_attention_backward_recomputation_counts_as_hardware_flops_only():
    cfg = get_preset("tiny")
    fused = train_step_flops("fused", cfg, batch=2)
    reference = train_step_flops("reference", cfg, batch=2)
    score_recompute = cfg.n_layers * 2 * 2 * cfg.seq_len * cfg.seq_len * cfg.d_model
    assert fused.model_flops == reference.model_flops
    assert fused.hardware_flops - fused.model_flops == score_recompute
    assert any("scaled_dot_product" in op for op in fused.by_op)


def test_activation_checkpointing_raises_hfu_above_mfu_by_the_recomputed_forward():
    lin1, lin2 = torch.nn.Linear(64, 128, bias=False), torch.nn.Linear(128, 64, bias=False)
    x = torch.randn(16, 64, requires_grad=True)
    forward = 2 * 16 * 64 * 128 * 2

    def block(t):
        return lin2(torch.relu(lin1(t)))

    with FlopCounter() as plain:
        block(x).sum().backward()
    with FlopCounter() as ckpt, set_checkpoint_early_stop(False):
        checkpoint(block, x, use_reentrant=False).sum().backward()
    with FlopCounter() as early:       # early stop: lin2's output is not needed, so not re-run
        checkpoint(block, x, use_reentrant=False).sum().backward()
    assert plain.model_flops == plain.hardware_flops == 3 * forward
    assert ckpt.model_flops == early.model_flops == 3 * forward
    assert ckpt.hardware_flops == 4 * forward
    assert early.hardware_flops == 3 * forward + forward // 2


def test_utilisation_and_peaks():
    assert utilisation(3e12, step_time_s=2.0, peak_flops=1e12) == 1.5
    assert utilisation(1.0, 1.0, None) is None
    assert peak_flops("cpu") is None
    assert peak_flops("cpu", peak_tflops=2) == 2e12


def test_the_dtype_most_flops_ran_in_is_the_compute_dtype_under_autocast():
    lin = torch.nn.Linear(32, 32)
    with FlopCounter() as fc, torch.autocast("cpu", dtype=torch.bfloat16):
        lin(torch.randn(4, 32))
    assert lin.weight.dtype == torch.float32 and fc.main_dtype == torch.bfloat16


@pytest.mark.parametrize("peak_tflops", [1.0, None])
def test_flops_callback_on_a_scripts_optimizer_steps_reports_flops_and_mfu_of_every_step(tmp_path, peak_tflops):
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    flops = FlopsCallback(peak_tflops=peak_tflops)
    with StepSource(get_adapter("torch"), [flops], str(tmp_path)) as source:
        for _ in range(3):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
    expected = 2 * 2 * 4 * 16 * 16          # forward and the weight gradient; no input gradient
    assert [s["step"] for s in source.steps] == [0, 1, 2]
    for s in source.steps:
        assert s["flops"] == s["hw_flops"] == expected
        if peak_tflops is None:                 # a CPU has no peak of its own: no MFU
            assert "mfu" not in s and "hfu" not in s
        else:
            assert s["mfu"] == pytest.approx(expected / (s["step_time_ms"] / 1e3 * 1e12))
