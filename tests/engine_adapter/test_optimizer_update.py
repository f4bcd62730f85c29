"""The update read from the optimizer's state equals the weights' change across the step."""

from __future__ import annotations

import math

import pytest
import torch

from probe.engine_adapter import optimizer_update
from probe.engine_adapter.optimizer_update import measure_param, reads_update
from probe.engine_adapter.torch_stats import TorchStats

KNOWN = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam-l2": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adamw-amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, amsgrad=True),
    "adamw-maximize": lambda ps: torch.optim.AdamW(ps, lr=0.01, maximize=True),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, fused=True),
    "adamw-tensor-lr": lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(0.01), weight_decay=0.1),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-dampening": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5),
}
UNKNOWN = {
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "sgd-decay": lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.01),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01),
}


def _steps(make, native: bool, monkeypatch, dtype=torch.float32):
    if not native:
        monkeypatch.setattr(optimizer_update, "native_kernel", lambda: False)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, dtype=dtype)) for n in (7, 40_000)]
    opt = make(params)
    stats = TorchStats()
    for _ in range(3):
        opt.zero_grad()
        sum((p * p).sum() * 0.5 + p.sum() for p in params).backward()
        before = [p.detach().clone() for p in params]
        opt.step()
        for p, b in zip(params, before):
            grad = stats.reduce(p.grad, "float")
            yield p, b, measure_param(stats, opt, opt.param_groups[0], p, grad), stats, opt


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_optimizers_give_the_weights_change(name, native, monkeypatch):
    for p, before, got, stats, opt in _steps(KNOWN[name], native, monkeypatch):
        assert got is not None
        values = stats.gather([got.delta, got.weight] + got.states)
        want = float((p.detach().double() - before.double()).norm())
        assert math.sqrt(values[0][3]) == pytest.approx(want, rel=2e-5)
        assert math.sqrt(values[1][3]) == pytest.approx(float(p.detach().double().norm()), rel=1e-6)
        state = [t for t in opt.state[p].values() if t.shape == p.shape]
        assert sum(v[3] for v in values[2:]) == pytest.approx(
            sum(float((t.double() ** 2).sum()) for t in state), rel=1e-6)
        assert values[1][4] == values[1][5] == 0


def test_float64_weights_take_the_native_pass(monkeypatch):
    for p, before, got, stats, _ in _steps(KNOWN["adamw"], True, monkeypatch, torch.float64):
        delta = stats.gather([got.delta])[0]
        assert math.sqrt(delta[3]) == pytest.approx(float((p.detach() - before).norm()), rel=1e-9)


def test_a_nan_weight_is_counted(monkeypatch):
    p = torch.nn.Parameter(torch.ones(50_000))
    opt = torch.optim.AdamW([p], lr=0.01)
    p.grad = torch.ones_like(p)
    opt.step()
    with torch.no_grad():
        p[3] = float("nan")
        p[9] = float("inf")
    got = measure_param(TorchStats(), opt, opt.param_groups[0], p, None)
    assert got.weight[4:] == [1.0, 1.0]


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_others_are_left_to_the_copy(name, monkeypatch):
    for _, _, got, _, _ in _steps(UNKNOWN[name], True, monkeypatch):
        assert got is None


@pytest.mark.parametrize("name", sorted(KNOWN) + sorted(UNKNOWN))
def test_reads_update_says_beforehand_what_measure_param_does(name):
    opt = {**KNOWN, **UNKNOWN}[name]([torch.nn.Parameter(torch.ones(3))])
    assert reads_update(opt, opt.param_groups[0]) == (name in KNOWN)


def test_the_adam_kernel_sums_squares_past_float32_in_double():
    """A second moment of 1e20 (gradients of 1e10, a diverging run): its sum of squares is
    1e42 per 100 elements, past float32; the kernel's float lanes overflowed to inf, and the
    state's norm read Infinity. They are summed again in double."""
    if not optimizer_update.native_kernel():
        pytest.skip("no C compiler: torch computes the norms")
    n = 100
    p, m, v = torch.ones(n), torch.full((n,), 1e10), torch.full((n,), 1e20)
    got = optimizer_update._adam_native(p, m, v, [0.01, 1.0, 1e-8, 0.0, 1.0])
    assert got[0] == pytest.approx(n) and got[1] == pytest.approx(n * 1e20, rel=1e-6)
    assert got[2] == pytest.approx(n * 1e40, rel=1e-6) and math.isfinite(got[2])
    assert got[3] == pytest.approx(n * 1e-4, rel=1e-5)      # u = 0.01 * 1e10 / 1e10
    assert got[4:] == (0.0, 0.0)
