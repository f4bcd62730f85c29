"""The flight recorder on the bundled engine: training unharmed, the origin named, bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from probe.engine_adapter.callbacks import CallbackSpec, TrainCallback
from tests.conftest import run_probe

WEIGHTS: dict[str, list] = {}


class KeepWeights(TrainCallback):
    """Keeps a copy of the trained weights (in this process: the run has one rank)."""

    def on_train_end(self, ctx, error=None):
        WEIGHTS[ctx.out_dir] = [p.detach().clone() for p in ctx.model.parameters()]


def _train(out, flight: int | None, faults=(), allow_nan=False, max_steps=6, level="module"):
    from probe.commands.flight_options import flight_callbacks
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec

    spec = RunSpec(preset="tiny", nproc=1, max_steps=max_steps, out_dir=str(out), quiet=True,
                   faults=tuple(faults), allow_nan=allow_nan,
                   callbacks=(*flight_callbacks(flight, level), CallbackSpec(KeepWeights)))
    return run_training(spec)


def test_the_recorder_leaves_losses_and_weights_bit_identical(tmp_path):
    plain = _train(tmp_path / "plain", None)
    recorded = _train(tmp_path / "recorded", 3)
    assert [r["loss"] for r in plain.steps] == [r["loss"] for r in recorded.steps]
    assert [r["grad_norm"] for r in plain.steps] == [r["grad_norm"] for r in recorded.steps]
    a, b = WEIGHTS[str(tmp_path / "plain")], WEIGHTS[str(tmp_path / "recorded")]
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert not (tmp_path / "recorded" / "flight_recorder").exists()      # no trigger: nothing written


def test_a_nan_run_writes_its_ring_and_origin_names_the_module_without_torch(tmp_path):
    out = tmp_path / "run"
    _train(out, 4, faults=("nan:layers.0.mlp@0:3",), allow_nan=True)
    marker = json.loads((out / "flight_recorder" / "rank0.json").read_text())
    assert marker["trigger"] == "nonfinite" and marker["steps"] == [0, 1, 2, 3]
    code = ("import json, sys; from probe.cli import main; rc = main(['origin', sys.argv[1], '--json']);"
            "assert 'torch' not in sys.modules, 'probe origin imported torch'; sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    found = json.loads(p.stdout)
    assert {k: found[k] for k in ("step", "rank", "module", "direction", "tensor")} == \
        {"step": 3, "rank": 0, "module": "layers.0.mlp", "direction": "forward", "tensor": "output.0"}
    assert isinstance(found["evidence"], str) and "NaN" in found["evidence"]
    q = run_probe("query", str(out), "select count(*) from tensors where step = 3 and nan_count > 0")
    assert q.returncode == 0 and "0\n" not in q.stdout.splitlines()[-2:]


def test_origin_on_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    for target, said in ((tmp_path / "missing", "not a run folder"), (tmp_path / "file", "not a run folder"),
                         (tmp_path / "empty", "no flight-recorder ring dump")):
        p = run_probe("origin", str(target))
        assert p.returncode == 2, p.stderr
        assert said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_at_mix_level_a_backward_nan_is_named_past_the_attention_masks_inf(tmp_path):
    from probe.compare.origin import find_origin

    out = tmp_path / "mix"
    _train(out, 3, faults=("nangrad:layers.0.mlp:3",), max_steps=4, level="mix")
    found = find_origin(out)
    assert (found["step"], found["module"], found["direction"], found["tensor"]) == \
        (3, "layers.0.mlp", "backward", "output.0"), found["evidence"]
