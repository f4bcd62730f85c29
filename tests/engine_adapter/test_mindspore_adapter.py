"""The MindSpore adapter against the PyTorch one: the same TinyNet, weights and inputs dumped
through each give matching entries (skips when mindspore is absent)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mindspore


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"embed": (32, 16), "block.attn.q": (32, 32), "block.attn.k": (32, 32),
              "block.attn.v": (32, 32), "block.attn.o": (32, 32), "block.mlp.fc1": (64, 32),
              "block.mlp.fc2": (32, 64), "head": (8, 32)}
    w = {}
    for name, shape in shapes.items():
        w[f"{name}.weight"] = rng.normal(0, 1 / math.sqrt(shape[1]), shape).astype(np.float32)
        w[f"{name}.bias"] = rng.normal(0, 0.2, shape[0]).astype(np.float32)
    for ln in ("block.ln1", "block.ln2"):
        w[f"{ln}.weight"] = (1 + rng.normal(0, 0.1, 32)).astype(np.float32)
        w[f"{ln}.bias"] = rng.normal(0, 0.1, 32).astype(np.float32)
    return w


def _torch_net(w):
    from torch import nn

    class TinyAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(32, 32) for _ in range(4))
            self.softmax = nn.Softmax(dim=-1)

        def forward(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)
            return self.o(self.softmax(q @ k.transpose(-1, -2) / math.sqrt(32)) @ v)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(32), TinyAttention(), nn.LayerNorm(32), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.block, self.head = nn.Linear(16, 32), Block(), nn.Linear(32, 8)

        def forward(self, x):
            return self.head(self.block(self.embed(x)))

    net = TinyNet()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})
    return net


def _ms_net(w):
    from mindspore import nn, ops

    class TinyAttention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Dense(32, 32) for _ in range(4))
            self.softmax = nn.Softmax(axis=-1)

        def construct(self, x):
            q, k, v = self.q(x), self.k(x), self.v(x)
            return self.o(ops.matmul(self.softmax(ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(32)), v))

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Dense(32, 64), nn.GELU(approximate=False), nn.Dense(64, 32)

        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm((32,), begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-5)
            self.attn = TinyAttention()
            self.ln2 = nn.LayerNorm((32,), begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-5)
            self.mlp = MLP()

        def construct(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TinyNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed, self.block, self.head = nn.Dense(16, 32), Block(), nn.Dense(32, 8)

        def construct(self, x):
            return self.head(self.block(self.embed(x)))

    net = TinyNet()
    renamed = {k.replace("ln1.weight", "ln1.gamma").replace("ln1.bias", "ln1.beta")
                .replace("ln2.weight", "ln2.gamma").replace("ln2.bias", "ln2.beta"): v for k, v in w.items()}
    params = dict(net.parameters_and_names())
    assert set(params) == set(renamed)
    for name, value in renamed.items():
        params[name].set_data(ms.Tensor(value))
    return net


def _inputs():
    rng = np.random.default_rng(1)
    return rng.normal(size=(4, 6, 16)).astype(np.float32), rng.normal(size=(4, 6, 8)).astype(np.float32)


def _dump_torch(out, w, level="module"):
    from probe.session import DumpSession

    net = _torch_net(w)
    x, y = (torch.from_numpy(a) for a in _inputs())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with DumpSession(net, out=str(out), level=level, store=False, auto_step=False, quiet=True):
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return json.loads((out / "step0/rank0/dump.json").read_text())


def _dump_ms(out, w, level="module"):
    from mindspore import nn

    from probe.session import DumpSession

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    net = _ms_net(w)
    x, y = (ms.Tensor(a) for a in _inputs())
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
    w = _weights()
    pt = _dump_torch(tmp_path / "pt", w)
    md = _dump_ms(tmp_path / "ms", w)
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
    w = _weights()
    pt = _dump_torch(tmp_path / "pt", w)
    md = _dump_ms(tmp_path / "ms", w)
    real_pt = json.loads((msprobe_data / "torch_L0/step0/proc0/dump.json").read_text())
    real_ms = json.loads((msprobe_data / "mindspore_L0/step0/proc0/dump.json").read_text())
    assert set(pt["data"]) == set(real_pt["data"])
    assert set(md["data"]) == set(real_ms["data"])
    for ours, real in ((pt, real_pt), (md, real_ms)):
        for name, entry in real["data"].items():
            assert list(ours["data"][name]) == list(entry) or set(ours["data"][name]) == set(entry), name


def test_mindspore_api_level_records_ops_and_tensor_calls(tmp_path):
    md = _dump_ms(tmp_path / "ms", _weights(), level="mix")
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
