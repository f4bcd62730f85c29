"""Per-module numerics: the callback's numbers, the detectors on synthetic series, the service's
window and alert book, and real bundled-engine runs against a monitor service (a ``grow``
fault is named before the loss turns NaN; a healthy run raises no numerics alert)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probe.engine_adapter.callbacks import CallbackSpec, TrainContext
from probe.monitor.agent.numerics_callback import NumericsCallback, select_modules
from probe.monitor.detectors.numerics import (ModuleMatrix, detect, large_updates, layer_ratios,
                                              nonfinite_modules, outliers)
from probe.monitor.detectors.numerics_window import NumericsWindow
from probe.monitor.numerics_names import QUANTITIES, metric_name, parse_metric_name
from probe.monitor.service.detection import AlertBook

from .conftest import wait_for


# -- names --------------------------------------------------------------------------------------

def test_metric_names_round_trip():
    assert QUANTITIES == ("activation_norm", "weight_norm", "grad_norm", "update_ratio",
                          "optimizer_state_norm", "nonfinite")
    for q in QUANTITIES:
        name = metric_name("layers.3.attn.q_proj", q)
        assert name == f"numerics:layers.3.attn.q_proj:{q}"
        assert parse_metric_name(name) == ("layers.3.attn.q_proj", q)
    for other in ("loss", "numerics:", "numerics:x", "numerics::grad_norm", "numerics:x:bogus"):
        assert parse_metric_name(other) is None
    with pytest.raises(ValueError):
        metric_name("x", "bogus")


# -- the callback -------------------------------------------------------------------------------

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.norm = torch.nn.LayerNorm(5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


class _Agent:
    """Stands in for MonitorAgent: what record() was given, in order."""

    def __init__(self):
        self.records = []

    def record(self, step, metrics, time_ns=None):
        self.records.append((step, dict(metrics), time_ns))
        return True


def _ctx(model, opt, agent=None):
    ctx = TrainContext(0, 1, "t", "/tmp", "script", "", None, model, opt, None, 3, None)
    if agent is not None:
        ctx.extra["monitor_agent"] = agent
    return ctx


def _norm(tensors):
    return math.sqrt(sum(float((t.detach().double() ** 2).sum()) for t in tensors))


OPTIMIZERS = {   # the update read from the optimizer's state (0 copies) or by copy (all)
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=0.05), 0),
    "sgd-momentum": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), 0),
    "rmsprop": (lambda ps: torch.optim.RMSprop(ps, lr=0.01), 6),
    "sgd-nesterov": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True), 6),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_callback_numbers_equal_torch_norms(name):
    torch.manual_seed(0)
    model = _Net()
    make, copies = OPTIMIZERS[name]
    opt = make(model.parameters())
    agent = _Agent()
    ctx = _ctx(model, opt, agent)
    cb = CallbackSpec(NumericsCallback).build()
    cb.on_train_start(ctx)
    assert cb.modules == ["fc1", "norm", "fc2"]
    outs = {}
    hooks = [getattr(model, n).register_forward_hook(
        lambda m, a, o, n=n: outs.__setitem__(n, o.detach().clone())) for n in cb.modules]
    for step in range(3):
        cb.on_step_start(ctx, step)
        opt.zero_grad()
        model(torch.randn(8, 6)).pow(2).mean().backward()
        before = {n: [p.detach().clone() for p in getattr(model, n).parameters()]
                  for n in cb.modules}
        opt.step()
        cb.on_step_end(ctx, step, {})
        got = {}
        for s, metrics, _ in agent.records[-3:]:
            assert s == step
            got.update(metrics)
        for n in cb.modules:
            mod = getattr(model, n)
            params = list(mod.parameters())
            w = _norm(params)
            want = {
                "activation_norm": _norm([outs[n]]),
                "weight_norm": w,
                "grad_norm": _norm([p.grad for p in params]),
                "update_ratio": _norm([p.detach() - b for p, b in zip(params, before[n])]) / w,
                "optimizer_state_norm": _norm([v for p in params for v in opt.state[p].values()
                                               if v.shape == p.shape]),
                "nonfinite": 0.0,
            }
            for q, v in want.items():
                assert got[metric_name(n, q)] == pytest.approx(v, rel=1e-5, abs=1e-9), (n, q)
    # one record per module, stamped with its forward time: the execution order
    times = [t for _, _, t in agent.records[-3:]]
    assert times == sorted(times) and [next(iter(m)).split(":")[1]
                                       for _, m, _ in agent.records[-3:]] == cb.modules
    assert cb.weights_copied == copies
    for h in hooks:
        h.remove()
    cb.on_train_end(ctx)
    assert not model.fc1._forward_hooks


def test_callback_counts_nan_and_falls_back_to_the_step_metrics():
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = _ctx(model, opt)
    cb = NumericsCallback(pattern=r"^fc")
    cb.on_train_start(ctx)
    assert cb.modules == ["fc1", "fc2"]
    with torch.no_grad():
        model.fc2.weight[0, 0] = float("nan")
    cb.on_step_start(ctx, 0)
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    metrics = {"loss": 1.0}
    cb.on_step_end(ctx, 0, metrics)
    assert metrics["numerics:fc1:nonfinite"] == 0
    # the weight (NaN after the step too, and its gradient row) and both output rows
    assert metrics["numerics:fc2:nonfinite"] >= 3
    assert math.isnan(metrics["numerics:fc2:weight_norm"])
    assert "numerics:fc2:optimizer_state_norm" not in metrics       # plain SGD keeps no state
    cb.on_train_end(ctx)


def test_select_modules():
    model = _Net()
    assert [p for p, _ in select_modules(model)] == ["fc1", "norm", "fc2"]
    assert [p for p, _ in select_modules(model, "norm")] == ["norm"]
    with pytest.raises(ValueError):
        NumericsCallback(pattern="(")


# -- the detectors on synthetic series ----------------------------------------------------------

def _series(steps=60, modules=8, ranks=2, seed=0, **change):
    """Wide rows of noisy healthy series; ``change(q, s, r, m, v) -> v`` alters them."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(steps):
        for r in range(ranks):
            for m in range(modules):
                row = {"rank": r, "step": s, "module": f"layers.{m}", "time_ns": 1000 * s + m}
                base = {"activation_norm": 10.0, "weight_norm": 5.0 * (1 + 0.001 * s),
                        "grad_norm": 0.5 * math.exp(-0.01 * s), "update_ratio": 1e-3,
                        "optimizer_state_norm": 0.05, "nonfinite": 0.0}
                for q, v in base.items():
                    if q != "nonfinite":
                        v *= math.exp(rng.normal(0, 0.1 if q != "weight_norm" else 0.002))
                    fn = change.get("fn")
                    row[q] = fn(q, s, r, m, v) if fn else v
                rows.append(row)
    return rows


def test_healthy_noisy_series_raise_nothing():
    for seed in range(3):
        assert detect(_series(steps=120, modules=10, ranks=4, seed=seed)) == []


def test_a_spike_far_outside_its_history_is_an_outlier():
    rows = _series(fn=lambda q, s, r, m, v: v * 40 if (q, r, m) == ("grad_norm", 1, 5) and s >= 40
                   else v)
    found = [(a["kind"], a["rank"], a["module"], a["quantity"]) for a in outliers(rows)]
    assert found and set(found) == {("numerics_outlier", 1, "layers.5", "grad_norm")}
    first = outliers(rows)[0]
    assert 42 <= first["step"] <= 45
    assert "above its own recent median" in first["message"]


def test_a_layer_that_grows_breaks_its_ratio_to_the_others():
    rows = _series(fn=lambda q, s, r, m, v: v * 1.3 ** max(0, s - 30)
                   if q in ("weight_norm", "activation_norm") and m == 3 else v)
    found = layer_ratios(rows)
    assert {(a["module"], a["quantity"]) for a in found} == {
        ("layers.3", "weight_norm"), ("layers.3", "activation_norm")}
    assert min(a["step"] for a in found) <= 36
    assert all(a["evidence"]["direction"] == "up" for a in found)


def test_vanishing_gradient_in_one_layer():
    rows = _series(fn=lambda q, s, r, m, v: v * 0.5 ** max(0, s - 30)
                   if q == "grad_norm" and m == 6 else v)
    found = layer_ratios(rows)
    assert {(a["module"], a["evidence"]["direction"]) for a in found} == {("layers.6", "down")}


def test_large_update_ratio():
    rows = _series(fn=lambda q, s, r, m, v: 0.3 if q == "update_ratio" and m == 2 and s >= 30 else v)
    found = large_updates(rows)
    assert {(a["rank"], a["module"]) for a in found} == {(0, "layers.2"), (1, "layers.2")}
    assert "changed the weights by 30.0% of their norm" in found[0]["message"]


def test_nonfinite_names_the_first_module_in_execution_order():
    # NaN appears at step 30 in layer 4 and (the next modules downstream) 5..7; the layers'
    # points are stamped with their forward times, which run 7, 6, ... 0 here (reversed)
    def fn(q, s, r, m, v):
        if q == "nonfinite":
            return 10.0 if s >= 30 and r == 0 and m <= 4 else 0.0
        return v

    rows = _series(fn=fn)
    for row in rows:
        row["time_ns"] = 1000 * row["step"] + (7 - int(row["module"].split(".")[1]))
    found = nonfinite_modules(rows)
    assert [(a["rank"], a["step"], a["module"]) for a in found] == [(0, 30, "layers.4")]
    assert "NaN/Inf first in layers.4" in found[0]["message"]
    assert found[0]["evidence"]["count"] == 5


def test_the_window_judges_as_the_whole_matrix():
    rows = _series(steps=150, fn=lambda q, s, r, m, v: v * 1.3 ** max(0, s - 120)
                   if q == "weight_norm" and m == 3 else v)
    import pyarrow as pa

    points = [{"rank": r["rank"], "step": r["step"], "name": metric_name(r["module"], q),
               "value": r[q], "time_ns": r["time_ns"]} for r in rows for q in QUANTITIES]
    whole = sorted((a["kind"], a["step"], a["rank"], a["module"]) for a in detect(rows)
                   if a["step"] >= 100)
    window, seen = NumericsWindow("j"), []
    for s in range(150):
        window.append(ModuleMatrix.from_points(pa.Table.from_pylist(
            [p for p in points if p["step"] == s])))
        seen += [(a["kind"], a["step"], a["rank"], a["module"]) for a in window.judge([s])
                 if a["step"] >= 100]
    assert sorted(seen) == whole and whole
    assert len(window.matrix.steps) == 100


def test_one_open_alert_per_module_and_quantity():
    book = AlertBook()
    a = {"kind": "numerics_layer_ratio", "job": "j", "rank": 0, "step": 10, "message": "m",
         "module": "layers.0", "quantity": "weight_norm", "evidence": {}}
    assert book.merge(a)[1] is True
    assert book.merge(dict(a, step=11))[1] is False              # updated in place
    assert book.merge(dict(a, step=11, module="layers.1"))[1] is True
    assert book.merge(dict(a, step=12, quantity="activation_norm"))[1] is True
    # after a restart the module and quantity are read back from the evidence
    book2 = AlertBook()
    book2.load(dict(a, module=None, quantity=None, evidence={"module": "layers.0",
                                                              "quantity": "weight_norm"}))
    assert book2.merge(dict(a, step=13))[1] is False


# -- real runs against a monitor service --------------------------------------------------------

def _train(tmp_path, monkeypatch, service, job, steps, faults=(), nproc=1):
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec

    env = {"PROBE_MONITOR": f"127.0.0.1:{service.port}", "PROBE_MONITOR_JOB": job,
           "PROBE_MONITOR_SPOOL": str(tmp_path / "spool")}
    for k, v in env.items():                    # one rank trains in this process
        monkeypatch.setenv(k, v)
    spec = RunSpec(preset="tiny", max_steps=steps, faults=tuple(faults), quiet=True,
                   out_dir=str(tmp_path / job), fsync="never", nproc=nproc,
                   extra_env=tuple(env.items()) + (("OMP_NUM_THREADS", "1"),),
                   callbacks=(CallbackSpec(NumericsCallback),))
    return run_training(spec)


def _numerics_alerts(service, job, until_step):
    wait_for(lambda: service.detection.judged_step(job) >= until_step, timeout=60,
             what=f"steps up to {until_step} judged")
    return [a for a in service.store.alerts(job).to_pylist() if a["kind"].startswith("numerics_")]


def test_grow_fault_is_named_before_the_loss_turns_nan(tmp_path, monkeypatch, service):
    layer = "layers.0.mlp.down_proj"
    result = _train(tmp_path, monkeypatch, service, "grow", 80, [f"grow:{layer}.weight:7"])
    nan_step = result.first_nonfinite["step"]               # training stopped there
    alerts = _numerics_alerts(service, "grow", nan_step)
    named = [a for a in alerts if layer in a["message"] and a["kind"] != "numerics_nonfinite"]
    assert named, [a["message"] for a in alerts]
    first = min(named, key=lambda a: a["step"])
    print(f"grow x8 a step from step 0: first alert naming {layer} at step {first['step']} "
          f"({first['kind']}), loss NaN at step {nan_step}")
    assert first["step"] < nan_step - 10, (first["step"], nan_step)
    # the first numerics alert of the run names the grown layer
    assert min(alerts, key=lambda a: (a["step"], a["id"]))["message"].find(layer) >= 0
    # the points are stored under their names, for every module
    names = service.store.metrics("grow", names=[metric_name(layer, q) for q in QUANTITIES])
    assert set(names.column("name").to_pylist()) == {metric_name(layer, q) for q in QUANTITIES}


def test_healthy_run_raises_no_numerics_alert(tmp_path, monkeypatch, service):
    _train(tmp_path, monkeypatch, service, "healthy", 40, nproc=2)
    assert _numerics_alerts(service, "healthy", 39) == []
    points = service.store.numerics_points("healthy", 0, 39)
    assert points.num_rows == 2 * 40 * 21 * 6              # 2 ranks, 21 modules, 6 quantities


def test_probe_train_numerics_option(tmp_path, monkeypatch):
    """``probe train --numerics REGEX``: without a monitor the points land in the run's store."""
    from click.testing import CliRunner

    from probe.collectors.store import open_store
    from probe.commands.train import command

    monkeypatch.delenv("PROBE_MONITOR", raising=False)
    out = tmp_path / "run"
    result = CliRunner().invoke(command, ["--max-steps", "2", "--quiet", "--fsync", "never",
                                          "--out", str(out), "--numerics", r"mlp\.down"])
    assert result.exit_code == 0, result.output
    names = {r[0] for r in open_store(str(out)).sql(
        "SELECT DISTINCT name FROM metrics WHERE name LIKE 'numerics:%'").fetchall()}
    assert names == {metric_name(f"layers.{i}.mlp.down_proj", q) for i in (0, 1)
                     for q in QUANTITIES}
    bare = CliRunner().invoke(command, ["--max-steps", "1", "--quiet", "--out", str(out),
                                        "--numerics", "--fsync", "never"])
    assert bare.exit_code == 0, bare.output
    assert open_store(str(out)).sql("SELECT count(DISTINCT name) FROM metrics WHERE name LIKE "
                                    "'numerics:%'").fetchall()[0][0] == 21 * 6
