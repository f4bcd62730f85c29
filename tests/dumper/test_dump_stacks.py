"""stack.json: each call's stack is its call site's, from the user's frame outwards."""

from __future__ import annotations

import json

import torch

from probe.dumper.session import DumpSession
from tests.conftest import ROOT


def _stacks(out, step: int) -> dict[str, list[str]]:
    groups = json.loads((out / f"step{step}/rank0/stack.json").read_text())
    return {name: lines for names, lines in groups.values() for name in names}


def _first(lines: list[str]) -> str:
    return lines[0].split("\n")[0]


def first_helper(x):
    return torch.relu(x)


def second_helper(x):
    return torch.relu(x)


def test_a_later_step_making_its_calls_in_another_order_gets_its_own_call_sites(tmp_path):
    s = DumpSession(out=str(tmp_path), level="api", auto_step=False, store=False).start()
    x = torch.randn(4)
    first_helper(x), second_helper(x)
    s.step()
    second_helper(x), first_helper(x)
    s.stop()
    step0, step1 = _stacks(tmp_path, 0), _stacks(tmp_path, 1)
    assert "in first_helper" in _first(step0["Torch.relu.0.forward"])
    assert "in second_helper" in _first(step1["Torch.relu.0.forward"])
    assert "in first_helper" in _first(step1["Torch.relu.1.forward"])


class Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        return self.b(x)


def test_stacks_start_at_the_user_frame_and_tell_apart_calls_from_one_library_line(tmp_path):
    model = Pair()
    s = DumpSession(model, out=str(tmp_path), level="mix", auto_step=False, store=False).start()
    model(torch.randn(2, 4)).sum().backward()
    s.stop()
    stacks = _stacks(tmp_path, 0)
    a, b = stacks["Module.a.Linear.forward.0"], stacks["Module.b.Linear.forward.0"]
    assert "test_dump_stacks.py" in _first(a) and "x = self.a(x)" in a[0]
    assert "return self.b(x)" in b[0]
    # both Functional.linear calls are made on one line of torch's Linear.forward; their stacks
    # go on through the module call each runs in
    lin0, lin1 = stacks["Functional.linear.0.forward"], stacks["Functional.linear.1.forward"]
    assert _first(lin0) == _first(lin1) and "linear.py" in _first(lin0)
    assert "self.a(x)" in "".join(lin0) and "self.b(x)" in "".join(lin1)
    for lines in stacks.values():
        assert not any("torch/nn/modules/module.py" in ln or f"{ROOT}/dumper/" in ln or "runpy" in ln
                       for ln in lines)


def test_the_same_call_site_reached_through_another_caller_keeps_its_caller(tmp_path):
    s = DumpSession(out=str(tmp_path), level="api", auto_step=False, store=False).start()
    x = torch.randn(4)

    def via_one():
        return first_helper(x)

    def via_two():
        return first_helper(x)

    via_one(), via_two()
    s.stop()
    stacks = _stacks(tmp_path, 0)
    assert "in via_one" in stacks["Torch.relu.0.forward"][1]
    assert "in via_two" in stacks["Torch.relu.1.forward"][1]
