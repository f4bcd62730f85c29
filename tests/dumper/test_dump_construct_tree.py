"""The dump's module tree (construct.json) is a forest, and backward mirrors forward.

A backward node's parent is the backward node of its forward call's parent (the same call
index): the order in which backward runs never decides the tree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from probe.dumper.session import DumpSession


def _construct(out: Path, step: int = 0, rank: int = 0) -> dict[str, str | None]:
    return json.loads((out / f"step{step}" / f"rank{rank}" / "construct.json").read_text())


def _is_backward(name: str) -> bool:
    return name.endswith(".backward") or ".backward." in name


def _mirror(name: str) -> str:
    """The other direction of the same call: ``X.forward.3`` <-> ``X.backward.3`` (a module),
    ``A.3.forward`` <-> ``A.3.backward`` (an API)."""
    swap = {"forward": "backward", "backward": "forward"}
    head, _, last = name.rpartition(".")
    if last in swap:
        return f"{head}.{swap[last]}"
    base, direction, n = name.rsplit(".", 2)
    return f"{base}.{swap[direction]}.{n}"


def assert_forest_mirroring_forward(construct: dict[str, str | None]) -> int:
    """No cycle, no orphan, forward nodes under forward nodes, and every backward node under the
    backward counterpart of its forward call's parent; returns how many backward parents were
    checked against their forward call."""
    for name, parent in construct.items():
        assert parent is None or parent in construct, f"{name}: parent {parent} is not in the tree"
        seen = {name}
        while parent is not None:
            assert parent not in seen, f"{name}: parent cycle through {parent}"
            seen.add(parent)
            parent = construct[parent]
    mirrored = 0
    for name, parent in construct.items():
        if parent is not None:
            assert _is_backward(parent) == _is_backward(name), f"{name} under {parent}"
        if not _is_backward(name):
            continue
        forward_parent = construct.get(_mirror(name))
        if forward_parent is not None:
            assert parent == _mirror(forward_parent), (name, parent, forward_parent)
            mirrored += 1
    return mirrored


@pytest.mark.parametrize("level", ["module", "mix"])
@pytest.mark.parametrize("engine", ["reference", "fused"])
def test_bundled_engine_dump_tree_is_a_forest_whose_backward_mirrors_forward(tmp_path, engine, level):
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec
    from probe.engine_adapter.callbacks import CallbackSpec
    from probe.dumper.callback import DumpCallback

    out = tmp_path / "d"
    dump = CallbackSpec(DumpCallback, {"level": level, "out": str(out)})
    run_training(RunSpec(engine=engine, preset="tiny", max_steps=1, out_dir=str(out), quiet=True,
                         compile=False, callbacks=(dump,), owner="dump"))
    construct = _construct(out)
    assert assert_forest_mirroring_forward(construct) > 10
    mlp = "Module.layers.1.mlp.MLP" if engine == "reference" else "Module.decoder.layers.1.mlp.MLP"
    if mlp + ".backward.0" in construct:
        assert construct[mlp + ".backward.0"] == construct[mlp + ".forward.0"].replace(".forward.", ".backward.")


class Body(nn.Module):
    """A module called twice, one reused in a loop, and one run under activation checkpointing."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.loop = nn.Linear(8, 8)
        self.ckpt = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.reentrant = reentrant

    def forward(self, x):
        x = torch.tanh(self.shared(x)) + self.shared(x * 2)
        for _ in range(3):
            x = self.loop(x)
        return checkpoint(self.ckpt, x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("level", ["module", "mix"])
def test_calls_twice_loops_and_checkpointing_keep_the_tree_a_mirrored_forest(tmp_path, level, reentrant):
    torch.manual_seed(0)
    net = nn.Sequential()
    net.add_module("body", Body(reentrant))
    x = torch.randn(2, 8, requires_grad=True)
    with DumpSession(net, out=tmp_path, level=level, store=False, auto_step=False, quiet=True):
        net(x).pow(2).sum().backward()
    construct = _construct(tmp_path)
    assert assert_forest_mirroring_forward(construct) >= 6
    for call in (0, 1):
        assert construct[f"Module.body.shared.Linear.backward.{call}"] == "Module.body.Body.backward.0"
    for call in (0, 1, 2):
        assert construct[f"Module.body.loop.Linear.backward.{call}"] == "Module.body.Body.backward.0"
    if not reentrant:   # the gradients flow through the first forward's graph: its call index
        assert construct["Module.body.ckpt.Sequential.backward.0"] == "Module.body.Body.backward.0"
        assert construct["Module.body.ckpt.0.Linear.backward.0"] == "Module.body.ckpt.Sequential.backward.0"
