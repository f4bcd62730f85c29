"""The library's hooks that call Python as they fire (``torch_grads.hooks()``: ``capture`` and
``watch``), used by the API level's backward capture and by the module level's Python path:
the same gradients, in the same order, as the Python hooks they replace, so the same dump.

Each test skips when the library cannot be built here (no C++ compiler or torch headers)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from probe.engine_adapter import torch_adapter, torch_grads
from probe.dumper.session import DumpSession

hooks = torch_grads.hooks()             # handing tensors over (prepared: see CallingHooks)
needs_hooks = pytest.mark.skipif(hooks is None, reason="the library cannot be built here (no C++ compiler or torch headers)")


class _Net(nn.Module):
    """Every road of the API level's capture: calls of one and of several differentiable
    inputs, a call whose output is a leaf (``Tensor.to`` of a parameter to its own dtype gives
    the parameter back), a sparse input (not strided: the Python autograd Function), a tuple
    output, a bfloat16 layer, a frozen layer and a module of two inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.low = nn.Linear(6, 6).to(torch.bfloat16)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        self.sparse = nn.Parameter(torch.eye(6).to_sparse())

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        s = self.scale.to(torch.float32)                      # a leaf output
        a, b = torch.chunk(h * s, 2, dim=1)                   # a tuple output
        g = torch.cat([b, a], dim=1)
        g = self.low(g.to(torch.bfloat16)).float()
        d = torch.sparse.mm(self.sparse, g.t()).t()           # a sparse input
        return self.frozen(d + h).sum() + (a * b).mean()


def _dump(out: Path, monkeypatch, level: str, with_hooks: bool, task: str = "statistics") -> dict:
    if not with_hooks:
        monkeypatch.setattr(torch_adapter.TorchAdapter, "_py_hooks", lambda self, sink: None)
    torch.manual_seed(0)
    net = _Net()
    x = torch.randn(4, 6, requires_grad=True)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad and not p.is_sparse], lr=0.1)
    with DumpSession(net, out=out, level=level, task=task, auto_step=False, quiet=True) as s:
        used = s.adapter._hooks
        for step in range(3):
            if step == 1:                                     # one backward, then the update
                net(x).backward()
            else:
                for _micro_batch in range(2):                 # gradient accumulation
                    net(x).backward()
                y = net(x)                                    # a graph backed through twice
                y.backward(retain_graph=True)
                y.backward()
                torch.autograd.grad(net(x), [x])              # only some inputs' gradients
            opt.step()
            opt.zero_grad()
            s.step()
    monkeypatch.undo()
    return {"hooks": used, "files": {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.json"))}}


def _without_ids(data: Any) -> Any:
    """``data`` with every ``tensor_id`` left out (nested argument lists too: the Python path's
    copies of parameter gradients take ids of their own, which shifts the later ones)."""
    if isinstance(data, dict):
        return {k: _without_ids(v) for k, v in data.items() if k != "tensor_id"}
    if isinstance(data, list):
        return [_without_ids(v) for v in data]
    return data


def _ids(data: dict) -> dict[tuple, int]:
    out = {}

    def walk(where: tuple, x: Any) -> None:
        if isinstance(x, dict):
            if "tensor_id" in x:
                out[where] = x["tensor_id"]
            for k, v in x.items():
                walk((*where, k), v)
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk((*where, i), v)
    for name, entry in data.items():
        walk((name,), entry)
    return out


@needs_hooks
@pytest.mark.parametrize("level", ["mix", "api"])
def test_the_librarys_hooks_write_the_python_hooks_dump_without_copying_parameter_gradients(
        tmp_path, monkeypatch, level):
    """The same entries, statistics and order as the Python hooks; tensor ids differ only
    where the Python hooks made autograd copy a parameter's gradient into .grad (they held the
    gradient): with the library's, .grad is the gradient the backward pass recorded, so its
    parameters_grad entry and the optimizer's reads of it are that tensor id."""
    native = _dump(tmp_path / "c", monkeypatch, level, with_hooks=True)
    python = _dump(tmp_path / "py", monkeypatch, level, with_hooks=False)
    assert native["hooks"].prepare is not None and python["hooks"] is None
    assert native["files"].keys() == python["files"].keys()
    merged_reads = set()
    for name, data in python["files"].items():
        if name.endswith("stack.json"):     # the two runs are called from two lines of this test
            assert json.loads(native["files"][name]).keys() == json.loads(data).keys()
        elif name.endswith("construct.json"):
            assert native["files"][name] == data, name
        else:
            ours, theirs = json.loads(native["files"][name])["data"], json.loads(data)["data"]
            assert list(ours) == list(theirs)
            assert _without_ids(ours) == _without_ids(theirs), name
            ids_c, ids_py = _ids(ours), _ids(theirs)
            assert ids_c.keys() == ids_py.keys()
            to_c: dict[int, set] = {}
            for slot, i in ids_py.items():
                to_c.setdefault(i, set()).add(ids_c[slot])
            assert all(len(v) == 1 for v in to_c.values())          # never split, only merged
            groups: dict[int, set] = {}
            for slot, i in ids_c.items():
                groups.setdefault(i, set()).add(ids_py[slot])
            for c_id, py_ids in groups.items():
                if len(py_ids) > 1:
                    slots = [slot for slot, i in ids_c.items() if i == c_id]
                    # a parameter's gradient: the call's backward entry, its parameters_grad
                    # (.grad, the same tensor) and the optimizer's read of it
                    assert any(".backward" in n or "parameters_grad" in n for n, *_ in slots), slots
                    merged_reads.update(n for n, *_ in slots if n.startswith("Tensor.add_."))
    assert merged_reads                     # SGD's param.add_(grad): one id with the backward's
    # (under gradient accumulation .grad is a sum made in place: read as the same id by neither)
    dump = json.loads(python["files"]["step1/rank0/dump.json"])["data"]
    backward = [k for k in dump if ".backward" in k]
    assert any(k.startswith("Tensor.to.") for k in backward)              # the leaf output's
    assert any(k.startswith("Torch.cat.") for k in backward)              # several inputs
    assert any(k.startswith(("Torch.sparse.mm.", "Torch.mm.", "Tensor.t.")) for k in backward)


@needs_hooks
@pytest.mark.parametrize("task", ["tensor", "md5"])
def test_a_task_that_reads_the_gradients_gets_the_tensors_and_the_python_hooks_dump(
        tmp_path, monkeypatch, task):
    native = _dump(tmp_path / "c", monkeypatch, "mix", with_hooks=True, task=task)
    python = _dump(tmp_path / "py", monkeypatch, "mix", with_hooks=False, task=task)
    assert native["hooks"].prepare is None
    for name, data in python["files"].items():
        if not name.endswith("stack.json"):          # (the tensor files' folder is each run's)
            ours = native["files"][name].replace(str(tmp_path / "c").encode(), b"OUT")
            assert ours == data.replace(str(tmp_path / "py").encode(), b"OUT"), name


@needs_hooks
def test_parameter_gradients_reach_grad_without_a_copy():
    """autograd copies a gradient into .grad when something else holds it: the recorder did,
    until its call's entry was made; handed over read, nothing holds it."""
    from torch.profiler import ProfilerActivity, profile

    def copies(level: str, monkeypatch_hooks: bool) -> int:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        x = torch.randn(4, 8)
        with pytest.MonkeyPatch.context() as mp:
            if monkeypatch_hooks:
                mp.setattr(torch_adapter.TorchAdapter, "_py_hooks", lambda self, sink: None)
            with DumpSession(net, out=tempfile.mkdtemp(), level=level, auto_step=False, quiet=True) as s:
                loss = net(x).sum()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    loss.backward()
                s.step()
        n = 0
        for e in prof.events():
            if e.name == "aten::copy_":
                p = e.cpu_parent
                while p is not None and "AccumulateGrad" not in p.name:
                    p = p.cpu_parent
                n += p is not None
        return n

    assert copies("mix", monkeypatch_hooks=True) > 0          # the Python hooks: copies
    assert copies("mix", monkeypatch_hooks=False) == 0


@needs_hooks
def test_the_module_levels_python_path_uses_them_and_writes_the_same_dump(tmp_path, monkeypatch):
    """The tensor task keeps the module level on the Python path (its recorder reads the
    tensors): its hooks are the library's, with the Python hooks' dump."""
    monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
    runs = {}
    for name, with_hooks in (("c", True), ("py", False)):
        if not with_hooks:
            monkeypatch.setattr(torch_adapter.TorchAdapter, "_py_hooks", lambda self, sink: None)
        torch.manual_seed(0)
        net = _Net()
        x = torch.randn(4, 6, requires_grad=True)
        with DumpSession(net, out=tmp_path / name, level="module", auto_step=False, quiet=True) as s:
            runs[name] = bool(s.adapter._hooks)
            for _ in range(2):
                net(x).backward()
                s.step()
    assert runs == {"c": True, "py": False}
    for p in sorted((tmp_path / "py").rglob("dump.json")):
        assert (tmp_path / "c" / p.relative_to(tmp_path / "py")).read_bytes() == p.read_bytes()


@needs_hooks
def test_capture_and_watch_hand_each_watched_gradient_to_the_function():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = torch.tensor([4.0, 5.0, 6.0], requires_grad=True)
    seen = []
    vx, vy = hooks.capture([x, y], lambda j, g: seen.append(("in", j, g.clone())))
    assert vx.data_ptr() == x.data_ptr() and vx._base is x
    out = torch.stack([vx * vy, vx + vy]).unbind(0)
    watched, leaves = hooks.watch([out[0], 7, y.detach(), out[1], y],
                                  lambda i, g: seen.append(("out", i, g.clone())))
    assert (watched, leaves) == (3, [4])                     # y: a leaf, hooked by the caller
    (out[0] * 2 + out[1] * 3).sum().backward()
    got = {(k, i): g for k, i, g in seen}
    assert torch.equal(got[("out", 0)], torch.full((3,), 2.0))
    assert torch.equal(got[("out", 3)], torch.full((3,), 3.0))
    assert torch.equal(got[("in", 0)], y.detach() * 2 + 3)
    assert torch.equal(got[("in", 1)], x.detach() * 2 + 3)
    assert len(seen) == 4


@needs_hooks
def test_an_exception_in_the_function_goes_up_through_backward():
    x = torch.ones(3, requires_grad=True)

    def fail(j, grad):
        raise ValueError("from the hook")

    (v,) = hooks.capture([x], fail)
    with pytest.raises(ValueError, match="from the hook"):
        (v * 2).sum().backward()
    y = torch.ones(3, requires_grad=True) * 2
    hooks.watch([y], fail)
    with pytest.raises(ValueError, match="from the hook"):
        y.sum().backward()


@needs_hooks
def test_bad_arguments_are_type_errors_not_crashes():
    with pytest.raises(TypeError):
        hooks.capture([torch.ones(2), "not a tensor"], print)
    with pytest.raises(TypeError):
        hooks.capture(3, print)
    with pytest.raises(TypeError):
        hooks.watch([torch.ones(2)])
    assert hooks.watch(["a", None, torch.ones(2)], print) == (0, [])
