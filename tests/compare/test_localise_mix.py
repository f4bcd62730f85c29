"""At mix level a weight fault is named by the module that owns the weight, in the headline and
in every affected node's "affected by" alike (the graph named the ``Functional.linear`` inside
the module while the headline named the module)."""

from __future__ import annotations

import torch
from torch import nn

from probe.compare.api import compare
from probe.dumper.session import DumpSession


def _run(out, scale: float) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    with torch.no_grad():
        net[2].weight.mul_(scale)
    x = torch.randn(4, 8)
    with DumpSession(net, out=out, level="mix", auto_step=False, quiet=True) as s:
        net(x).sum().backward()
        s.step()


def test_the_headline_and_affected_by_name_the_module_owning_the_faulty_weight(tmp_path):
    _run(tmp_path / "a", 1.0)
    _run(tmp_path / "b", 1.5)
    r = compare(str(tmp_path / "a"), str(tmp_path / "b"))
    first = r.summary["first_divergence"]
    assert first["a"] == "Module.2.Linear.forward.0", first
    nodes = r.nodes.to_pylist()
    affected = [n for n in nodes if n["affected_by_a"] is not None]
    assert affected, "the nodes after the fault are affected by it"
    assert {n["affected_by_a"] for n in affected} == {first["a"]}
    later = [n["node_a"] for n in affected]
    assert "Module.4.Linear.forward.0" in later
