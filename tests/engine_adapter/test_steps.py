"""StepSource: a script's optimizer steps, through any engine adapter, as training-callback calls."""

from __future__ import annotations

import torch

from probe.engine_adapter.base import get_adapter
from probe.engine_adapter.callbacks import TrainCallback
from probe.engine_adapter.steps import StepSource


class Calls(TrainCallback):
    def __init__(self):
        self.calls = []

    def on_train_start(self, ctx):
        self.calls.append(("train_start", ctx.engine, ctx.rank, ctx.world_size, ctx.run))

    def on_step_start(self, ctx, step):
        self.calls.append(("step_start", step))

    def on_step_end(self, ctx, step, metrics):
        self.calls.append(("step_end", step, sorted(metrics)))
        metrics["seen_by"] = 1.0

    def on_train_end(self, ctx, error=None):
        self.calls.append(("train_end", error))


class Broken(TrainCallback):
    def on_step_end(self, ctx, step, metrics):
        raise RuntimeError("broken callback")


def _train(opt, model, n):
    for _ in range(n):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()


def test_each_optimizer_step_ends_a_step_and_starts_the_next_in_callback_order(tmp_path):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = Calls()
    with StepSource(get_adapter("torch"), [calls], str(tmp_path / "run")) as source:
        _train(opt, model, 2)
    assert calls.calls == [("train_start", "script", 0, 1, "run"), ("step_start", 0),
                           ("step_end", 0, ["step_time_ms"]), ("step_start", 1),
                           ("step_end", 1, ["step_time_ms"]), ("step_start", 2), ("train_end", None)]
    assert [s["step"] for s in source.steps] == [0, 1]
    assert all(s["seen_by"] == 1.0 and s["step_time_ms"] > 0 for s in source.steps)


def test_after_stop_optimizer_steps_call_nothing(tmp_path):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = Calls()
    source = StepSource(get_adapter("torch"), [calls], str(tmp_path)).start()
    _train(opt, model, 1)
    source.stop()
    source.stop()
    _train(opt, model, 2)
    assert [c[0] for c in calls.calls].count("step_end") == 1
    assert calls.calls[-1] == ("train_end", None)


def test_a_failing_callback_is_disabled_and_the_others_still_see_every_step(tmp_path, logged):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = Calls()
    with StepSource(get_adapter("torch"), [Broken(), calls], str(tmp_path)) as source:
        _train(opt, model, 3)
    assert len(source.steps) == 3
    assert [c[1] for c in calls.calls if c[0] == "step_end"] == [0, 1, 2]
    assert "broken callback" in logged()


def test_any_adapter_drives_the_steps_through_its_watch_steps(tmp_path):
    torch_adapter = get_adapter("torch")

    class OtherEngine(type(torch_adapter)):
        """An engine whose optimizer is a plain function: its step hook is the adapter's."""

        def watch_steps(self, on_step):
            self.on_step = on_step

        def detach(self):
            self.on_step = None

    engine = OtherEngine()
    calls = Calls()
    with StepSource(engine, [calls], str(tmp_path)) as source:
        engine.on_step()
        engine.on_step()
    assert engine.on_step is None
    assert [s["step"] for s in source.steps] == [0, 1]
    assert calls.calls[-1] == ("train_end", None)


def test_an_error_in_the_script_reaches_on_train_end(tmp_path):
    calls = Calls()
    error = ValueError("the script failed")
    try:
        with StepSource(get_adapter("torch"), [calls], str(tmp_path)):
            raise error
    except ValueError:
        pass
    assert calls.calls[-1] == ("train_end", error)
