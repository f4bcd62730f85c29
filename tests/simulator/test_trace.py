"""The trace of a training step on fake tensors: what each storage is, where and when."""

from __future__ import annotations

import torch

from probe.simulator.fake_run import FakeRun
from probe.simulator.memory import timeline
from probe.simulator.trace import BACKWARD, CATEGORIES, FORWARD, OPTIMIZER


def _train(steps: int = 2):
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    for _ in range(steps + 1):
        model(torch.randn(64, 512)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def test_model_states_of_a_step_are_counted_exactly_by_category():
    with FakeRun(max_steps=2) as run:
        _train()
    trace = run.tracer.trace
    n = 512 * 1024 + 1024 + 1024 * 256 + 256
    assert run.stopped and run.steps == 2 and trace.params == n
    maxima = timeline(trace).maxima()
    assert maxima["params"] == 4 * n
    assert maxima["grads"] == 4 * n
    assert maxima["optimizer"] == 8 * n + 4 * 4          # exp_avg, exp_avg_sq, and 4 step counters
    # saved for backward: the input (64x512), the first output (ReLU's), the ReLU output
    assert maxima["activations"] >= 4 * (64 * 512 + 64 * 1024)


def test_ops_carry_their_module_phase_and_flops():
    with FakeRun(max_steps=2) as run:
        _train()
    trace = run.tracer.trace
    by_phase = {p: {trace.modules[m] for m, ph in zip(trace.op_module, trace.op_phase) if ph == p}
                for p in (FORWARD, BACKWARD, OPTIMIZER)}
    assert {"Sequential.0", "Sequential.2"} <= by_phase[FORWARD]
    assert "Sequential.2" in by_phase[BACKWARD]
    step1 = [f for f, s in zip(trace.op_model_flops, trace.op_step) if s == 1]
    forward = 2 * 64 * (512 * 1024 + 1024 * 256)
    input_grad_of_first_layer = 2 * 64 * 512 * 1024        # not computed: the batch needs none
    assert sum(step1) == 3 * forward - input_grad_of_first_layer


def test_a_storage_dies_when_python_drops_its_last_tensor():
    with FakeRun() as run:
        kept = torch.ones(1 << 20)
        gone = kept * 2
        del gone
        kept.add_(1)
    total = timeline(run.tracer.trace).total.tolist()
    assert total == [4 << 20, 8 << 20, 4 << 20]
    assert CATEGORIES[-1] == "temporary"


def test_model_to_works_on_fake_parameters_and_keeps_them_as_params():
    with FakeRun(max_steps=1) as run:
        model = torch.nn.Linear(256, 256).to(torch.bfloat16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 256, dtype=torch.bfloat16)).sum().backward()
        opt.step()
    maxima = timeline(run.tracer.trace).maxima()
    assert maxima["params"] >= 2 * (256 * 256 + 256)
    assert run.tracer.trace.params == 256 * 256 + 256
