"""A framework registered at runtime (:mod:`tests.engine_adapter.toyfw_adapter`) is dumped by
the one dump code and compared against a PyTorch dump of the same network, module for module."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from probe.ground.frameworks import module_prefixes, register_framework, unregister_framework  # noqa: E402
from tests.engine_adapter import toyfw_adapter as toyfw  # noqa: E402


@pytest.fixture
def toy_registered():
    register_framework(toyfw.SPEC)
    yield toyfw.SPEC
    unregister_framework(toyfw.SPEC.name)


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


class ToyNet(torch.nn.Module):
    """TorchNet in toyfw's layers, with TorchNet's weights."""

    def __init__(self, like: TorchNet) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = toyfw.Dense(4, 8), toyfw.LayerNorm(8), toyfw.Dense(8, 2)
        with torch.no_grad():
            for ours, theirs in ((self.fc1, like.fc1), (self.fc2, like.fc2)):
                ours.weight.copy_(theirs.weight)
                ours.bias.copy_(theirs.bias)
            self.norm.gamma.copy_(like.norm.weight)
            self.norm.beta.copy_(like.norm.bias)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def _dump(net, out, framework: str) -> dict:
    from probe.dumper.session import DumpSession

    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with DumpSession(net, out=str(out), framework=framework, store=False, auto_step=False, quiet=True):
        net(x).square().mean().backward()
        opt.step()
    return json.loads((out / "step0/rank0/dump.json").read_text())


def test_registered_framework_dumps_with_its_own_names_and_matches_torch_module_for_module(
        tmp_path, toy_registered):
    from probe.compare.api import compare

    assert "Block" in module_prefixes()
    torch.manual_seed(0)
    torch_net = TorchNet()
    toy_net = ToyNet(torch_net)                  # the weights copied before a step changes them
    pt = _dump(torch_net, tmp_path / "pt", "torch")
    toy = _dump(toy_net, tmp_path / "toy", "toy")                  # by its alias

    assert toy["framework"] == "toyfw" and pt["framework"] == "pytorch"
    modules = {k for k in toy["data"] if not k.startswith(("Torch.", "Functional.", "Tensor."))}
    assert modules == {f"Block.{m}.{d}.{n}" for m in ("fc1.Dense", "norm.LayerNorm", "fc2.Dense")
                       for d, n in (("forward", 0), ("backward", 0), ("parameters_grad", 0))}
    assert set(toy["data"]["Block.norm.LayerNorm.parameters_grad.0"]) == {"gamma", "beta"}
    stacks = (tmp_path / "toy/step0/rank0/stack.json").read_text()
    assert "toyfw_adapter.py" not in stacks and "test_framework_registry.py" in stacks

    r = compare(str(tmp_path / "toy"), str(tmp_path / "pt"))
    forward = {(n["node_a"], n["node_b"]): n for n in r.nodes.to_pylist() if n["direction"] == "forward"}
    assert set(forward) == {(f"Block.{m}.{a}.forward.0", f"Module.{m}.{b}.forward.0")
                            for m, a, b in (("fc1", "Dense", "Linear"), ("norm", "LayerNorm", "LayerNorm"),
                                            ("fc2", "Dense", "Linear"))}
    for node in forward.values():
        assert node["kind"] == "module" and node["match_method"] == "exact", node
    assert r.summary["unmatched_a"] == 0 and r.summary["unmatched_b"] == 0
    assert set(r.summary["verdicts"]) == {"pass"}, r.summary["verdicts"]
    params = {row["index"] for row in r.rows.to_pylist() if row["slot"] == "parameter_grad"}
    assert params == {"weight", "bias"}


def test_a_framework_registered_twice_under_one_prefix_or_name_is_refused(toy_registered):
    from probe.ground.errors import ProbeError
    from probe.ground.frameworks import FrameworkSpec, framework

    assert register_framework(toyfw.SPEC) is toyfw.SPEC            # the same row again: no change
    with pytest.raises(ProbeError, match="module prefix 'Block'"):
        register_framework(FrameworkSpec("other", "other", "Block", "x.other_adapter"))
    with pytest.raises(ProbeError, match="the name 'toy' is taken by 'toyfw'"):
        register_framework(FrameworkSpec("other", "other", "Other", "x.other_adapter", ("toy",)))
    with pytest.raises(ProbeError, match="not an identifier"):
        FrameworkSpec("other", "other", "Bad'prefix", "x.other_adapter")
    assert framework("toy") is toyfw.SPEC


def test_a_framework_whose_adapter_module_is_missing_says_so(toy_registered):
    from probe.engine_adapter.base import get_adapter
    from probe.ground.errors import ProbeError
    from probe.ground.frameworks import FrameworkSpec

    register_framework(FrameworkSpec("ghost", "ghost", "Ghost", "no_such_pkg.ghost_adapter"))
    try:
        with pytest.raises(ProbeError, match="its adapter module no_such_pkg.ghost_adapter is missing"):
            get_adapter("ghost")
    finally:
        unregister_framework("ghost")
    assert type(get_adapter("toyfw")).__name__ == "ToyAdapter"
