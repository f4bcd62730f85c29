"""A call whose output is a leaf (a parameter returned as it is: ``weight.to(weight.dtype)``, a
module returning its own weight) gets a tensor hook for its gradient; the leaf lives across
steps, so the hooks are removed as each step ends instead of piling up (one more a step, every
later backward running them all)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from probe.dumper.session import DumpSession
from probe.engine_adapter import torch_grads


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.scale.to(torch.float32)     # .to of its own dtype: the leaf


class _LeafOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.w


def _hooks(t: torch.Tensor) -> int:
    return len(t._backward_hooks or {})


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("level", ["module", "mix"])
def test_leaf_output_hooks_do_not_pile_up_across_steps(tmp_path, monkeypatch, level, native):
    if not native:
        monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
        monkeypatch.setattr(torch_grads, "hooks", lambda prepared=False: None)
    net = nn.ModuleDict({"scaled": _Scaled(), "leaf": _LeafOut()})
    x = torch.randn(2, 4)
    counts = []
    with DumpSession(net, out=tmp_path, level=level, store=False, auto_step=False, quiet=True) as s:
        for _ in range(6):
            (net["scaled"](x) * net["leaf"](x)).sum().backward()
            s.step()
            counts.append((_hooks(net["scaled"].scale), _hooks(net["leaf"].w)))
    assert counts == [(0, 0)] * 6, counts
    last = json.loads(sorted(tmp_path.rglob("dump.json"))[-1].read_text())["data"]
    assert "Module.leaf._LeafOut.backward.0" in last        # still recorded every step
