"""The MindSpore adapter against the PyTorch one: the same TinyNet, weights and inputs dumped
through each give matching entries (skips when mindspore is absent)."""

from __future__ import annotations

import json

import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mindspore

from tests.msprobe_fixtures import mindspore_tinynet, tinynet_inputs, torch_tinynet  # noqa: E402
from tests.dumper.test_dump_construct_tree import assert_forest_mirroring_forward  # noqa: E402


def _dump_torch(out, level="module"):
    from probe.dumper.session import DumpSession

    net = torch_tinynet()
    x, y = (torch.from_numpy(a) for a in tinynet_inputs())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with DumpSession(net, out=str(out), level=level, store=False, auto_step=False, quiet=True):
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return json.loads((out / "step0/rank0/dump.json").read_text())


def _dump_ms(out, level="module"):
    from mindspore import nn

    from probe.dumper.session import DumpSession

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    net = mindspore_tinynet()
    x, y = (ms.Tensor(a) for a in tinynet_inputs())
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)

    def loss_fn(x, y):
        return ((net(x) - y) ** 2).mean()
    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    with DumpSession(net, out=str(out), level=level, framework="mindspore", store=False,
                     auto_step=False, quiet=True):
        _, grads = grad_fn(x, y)
        opt(grads)
    return json.loads((out / "step0/rank0/dump.json").read_text())


def _to_torch_name(name: str) -> str:
    return "Module." + name[len("Cell."):].replace(".Dense.", ".Linear.")


def _leaves(value):
    if isinstance(value, dict) and "type" in value:
        yield value
    elif isinstance(value, dict):
        for k in sorted(value, key=lambda k: {"gamma": "weight", "beta": "bias"}.get(k, k)):
            yield from _leaves(value[k])
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)


def test_mindspore_and_pytorch_dumps_of_one_network_have_matching_entries(tmp_path):
    pt = _dump_torch(tmp_path / "pt")
    md = _dump_ms(tmp_path / "ms")
    assert md["framework"] == "mindspore" and md["level"] == "L0"
    mapped = {_to_torch_name(k): v for k, v in md["data"].items()}
    assert set(mapped) == set(pt["data"])
    assert len(mapped) == 40
    first = next(iter(md["data"].values()))["input_args"][0]
    assert first["type"] == "mindspore.Tensor" and first["dtype"] == "Float32" and "requires_grad" not in first
    assert set(md["data"]["Cell.block.ln1.LayerNorm.parameters_grad.0"]) == {"gamma", "beta"}
    compared = 0
    for name, entry in mapped.items():
        ours, theirs = list(_leaves(entry)), list(_leaves(pt["data"][name]))
        assert len(ours) == len(theirs), name
        for a, b in zip(ours, theirs):
            assert a["shape"] == b["shape"], name
            for stat in ("Max", "Min", "Mean", "Norm"):
                assert a[stat] == pytest.approx(b[stat], rel=1e-4, abs=1e-5), (name, stat)
            compared += 1
    assert compared >= 90


def test_our_dumps_of_tinynet_have_the_keys_of_the_real_msprobe_dumps(tmp_path, msprobe_data):
    pt = _dump_torch(tmp_path / "pt")
    md = _dump_ms(tmp_path / "ms")
    real_pt = json.loads((msprobe_data / "torch_L0/step0/proc0/dump.json").read_text())
    real_ms = json.loads((msprobe_data / "mindspore_L0/step0/proc0/dump.json").read_text())
    assert set(pt["data"]) == set(real_pt["data"])
    assert set(md["data"]) == set(real_ms["data"])
    for ours, real in ((pt, real_pt), (md, real_ms)):
        for name, entry in real["data"].items():
            assert list(ours["data"][name]) == list(entry) or set(ours["data"][name]) == set(entry), name



@pytest.mark.parametrize("level", ["module", "mix"])
def test_mindspore_dump_tree_is_a_forest_whose_backward_mirrors_forward(tmp_path, level):
    """construct.json of a MindSpore dump: no parent cycle, and each backward cell sits under
    the backward node of its forward call's parent, as in the PyTorch dump."""
    _dump_ms(tmp_path / "ms", level=level)
    construct = json.loads((tmp_path / "ms/step0/rank0/construct.json").read_text())
    assert assert_forest_mirroring_forward(construct) >= 6
    assert construct["Cell.block.mlp.fc1.Dense.backward.0"] == "Cell.block.mlp.MLP.backward.0"
    assert construct["Cell.block.mlp.MLP.backward.0"] == "Cell.block.Block.backward.0"

def test_mindspore_api_level_records_ops_and_tensor_calls(tmp_path):
    md = _dump_ms(tmp_path / "ms", level="mix")
    keys = list(md["data"])
    assert "Cell.block.attn.q.Dense.forward.0" in keys
    assert any(k.startswith("Functional.matmul.") for k in keys)
    assert any(k.startswith("Tensor.__add__.") or k.startswith("Tensor.__sub__.") for k in keys)


def test_probe_dump_runs_a_mindspore_script_with_steps_from_its_optimizer(tmp_path):
    from tests.conftest import run_probe

    script = tmp_path / "train_ms.py"
    script.write_text(
        "import numpy as np\n"
        "import mindspore as ms\n"
        "from mindspore import nn\n"
        "ms.set_context(mode=ms.PYNATIVE_MODE)\n"
        "net = nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 1)])\n"
        "opt = nn.SGD(net.trainable_params(), learning_rate=0.1)\n"
        "grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)\n"
        "for step in range(3):\n"
        "    loss, grads = grad_fn(ms.Tensor(np.ones((2, 4), np.float32)))\n"
        "    opt(grads)\n")
    out = tmp_path / "d"
    r = run_probe("dump", "--framework", "mindspore", "--steps", "0,2", "--out", str(out), "--", str(script))
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in out.glob("step*")) == ["step0", "step2"]
    data = json.loads((out / "step2/rank0/dump.json").read_text())["data"]
    assert {"Cell.0.Dense.forward.0", "Cell.2.Dense.backward.0", "Cell.0.Dense.parameters_grad.0"} <= set(data)


def test_mindspore_statistics_of_values_past_float32_squared_are_finite():
    """Host tensors of 1e20: the sum of squares (1e42 here) was float32's dot, inf; the same
    finite numbers as PyTorch's now."""
    import numpy as np

    from probe.engine_adapter.mindspore_adapter import MindSporeStats
    from probe.engine_adapter.torch_stats import TorchStats

    a = np.array([1e20, -3e20, 2.0] * 10, dtype=np.float32)
    s, t = MindSporeStats(), ms.Tensor(a)
    got = s.gather([s.reduce(t, s.describe(t).kind)])[0]
    x = torch.from_numpy(a)
    want = TorchStats().gather([TorchStats().reduce(x, TorchStats().describe(x).kind)])[0]
    assert got == pytest.approx(want, rel=1e-6) and got[3] == pytest.approx(1e42, rel=1e-6)
