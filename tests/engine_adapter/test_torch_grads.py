"""The C++ backward capture (engine_adapter/torch_grads.cpp): the module level's gradients read
without calling into Python during the backward pass, replayed into the same dump.

Each test that needs the library skips when it cannot be built here (no C++ compiler or no
torch headers); the first test to use it builds it once per machine (~15 s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from probe.engine_adapter import torch_grads
from probe.dumper.recorder import DumpRecorder
from probe.dumper.session import DumpSession

needs_native = pytest.mark.skipif(not torch_grads.available(),
                                  reason="the C++ capture cannot be built here (no C++ compiler or torch headers)")


class _Pair(nn.Module):
    """Two differentiable inputs (one gather), a tuple of two outputs."""

    def forward(self, a, b):
        return a * b, a - b


class _Mixed(nn.Module):
    """A module tree whose gradients take every road of the capture: an embedding (no
    differentiable input), a bfloat16 and a float64 layer (read through a copy or as they lie),
    a module of two inputs and two outputs, an empty layer (a gradient without elements: the
    Python path's, at once), a frozen layer, and a last layer whose output gradient, from
    ``sum()``, is not dense (a stride-0 expansion)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.lin = nn.Linear(8, 8)
        self.low = nn.Linear(8, 8).to(torch.bfloat16)
        self.wide = nn.Linear(8, 8, dtype=torch.float64)
        self.pair = _Pair()
        self.empty = nn.Linear(8, 0)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.act = nn.Tanh()
        self.head = nn.Linear(8, 1)

    def forward(self, idx):
        h = self.emb(idx)
        a = self.lin(h)
        b = self.low(a.to(torch.bfloat16)).float()
        c = self.wide(a.double()).float()
        u, v = self.pair(b, c)
        e = self.empty(u)
        z = self.act(self.frozen(u + v) + e.sum())
        return self.head(z)


def _train(out: Path, monkeypatch, native: bool, level: str = "module") -> dict:
    if not native:
        monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
        monkeypatch.setattr(torch_grads, "hooks", lambda prepared=False: None)
    torch.manual_seed(0)
    net = _Mixed()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
    idx = torch.randint(0, 10, (4, 3))
    with DumpSession(net, out=out, level=level, auto_step=False, quiet=True) as s:
        used = s.adapter._native if level == "module" else s.adapter._hooks
        for _ in range(2):
            for _micro_batch in range(2):                 # gradient accumulation
                net(idx).sum().backward()
            y = net(idx).sum()                            # a graph backed through twice
            y.backward(retain_graph=True)
            y.backward()
            opt.step()
            opt.zero_grad()
            s.step()
    monkeypatch.undo()
    from probe.collectors.store import open_store

    con = open_store(out / "store")
    columns = [c[0] for c in con.execute("SELECT * FROM tensors LIMIT 0").description
               if c[0] not in ("host_ts_ns", "run")]
    records = con.execute(f"SELECT {', '.join(columns)} FROM tensors ORDER BY ALL").fetchall()
    return {"native": bool(used), "records": records,
            "files": {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.json"))}}


def _without_ids(data: bytes) -> Any:
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "tensor_id"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(json.loads(data))


@needs_native
def test_the_api_levels_capture_in_cpp_writes_the_dump_the_python_walk_writes(tmp_path, monkeypatch):
    """At mix level each API call's input gradients are read where the call's nodes take
    them: the C++ walk and hooks (``capture_edges_calling``) against the Python ones, byte for
    byte, through accumulation, a graph backed through twice, a call with two inputs, inputs
    used twice in one call (``u + v`` of views) and an empty and a frozen layer."""
    native = _train(tmp_path / "native", monkeypatch, native=True, level="mix")
    python = _train(tmp_path / "python", monkeypatch, native=False, level="mix")
    assert native["native"] and not python["native"]
    assert native["files"].keys() == python["files"].keys()
    # (tensor ids aside: the Python path holds each call's gradients until the call's entry is
    # made, so autograd copies a parameter's gradient into .grad instead of taking it, and
    # parameters_grad's .grad is another tensor than the call's gradient; the C++ path hands
    # them over read and holds none)
    assert len(python["records"]) > 300
    assert [r[:-1] for r in native["records"]] == [r[:-1] for r in python["records"]]
    for name, data in python["files"].items():
        if not name.endswith("stack.json"):
            assert _without_ids(native["files"][name]) == _without_ids(data), name
    dump = json.loads(python["files"]["step1/rank0/dump.json"])["data"]
    backward = [k for k in dump if k.startswith(("Tensor.", "Torch.", "Functional.")) and k.endswith(".backward")]
    assert len(backward) > 20


@needs_native
def test_the_native_capture_writes_the_dump_the_python_hooks_write(tmp_path, monkeypatch):
    native = _train(tmp_path / "native", monkeypatch, native=True)
    python = _train(tmp_path / "python", monkeypatch, native=False)
    assert native["native"] and not python["native"]
    assert native["files"].keys() == python["files"].keys()
    assert len(python["records"]) > 100 and native["records"] == python["records"]
    for name, data in python["files"].items():
        if name.endswith("stack.json"):     # the two runs are called from two lines of this test
            assert json.loads(native["files"][name]).keys() == json.loads(data).keys()
        else:
            assert native["files"][name] == data, name  # byte for byte: entries, order, tensor ids
    dump = json.loads(python["files"]["step1/rank0/dump.json"])["data"]
    # what the model was built to exercise is in the dump
    assert dump["Module.pair._Pair.backward.0"]["output"][1]["dtype"] == "torch.float32"
    assert dump["Module.low.Linear.parameters_grad.0"]["weight"][0]["dtype"] == "torch.bfloat16"
    assert dump["Module.wide.Linear.parameters_grad.0"]["weight"][0]["dtype"] == "torch.float64"
    assert dump["Module.empty.Linear.parameters_grad.0"]["weight"][0]["Max"] is None
    assert "Module.emb.Embedding.backward.0" in dump and "Module.frozen.Linear.parameters_grad.0" not in dump
    assert sum(k.startswith("Module.head.Linear.backward.") for k in dump) == 4


@needs_native
def test_the_backward_pass_calls_no_recorder_hook_they_are_replayed_as_the_step_ends(tmp_path, monkeypatch):
    log: list[str] = []
    for hook in ("module_backward", "parameter_grad"):
        original = getattr(DumpRecorder, hook)

        def logged(self, *args, _original=original, **kwargs):
            log.append("hook")
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(DumpRecorder, hook, logged)
    started = DumpRecorder.backward_started
    monkeypatch.setattr(DumpRecorder, "backward_started",
                        lambda self: (log.append("backward started"), started(self))[1])
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    with DumpSession(net, out=tmp_path, store=False, auto_step=False, quiet=True) as s:
        assert s.adapter._native
        net(torch.randn(3, 4, requires_grad=True)).sum().backward()
        log.append("backward returned")
        s.step()
    assert log[0] == "backward started" and log[1] == "backward returned"
    assert log.count("hook") == 3 + 4          # three modules, two weights and two biases
    data = json.loads(next(tmp_path.rglob("dump.json")).read_text())["data"]
    assert data["Module.0.Linear.backward.0"]["output"][0]["shape"] == [3, 4]


@needs_native
def test_a_create_graph_backward_gives_the_same_entries_as_the_python_hooks(tmp_path, monkeypatch):
    """Gradients that require grad (a gradient penalty's backward) keep their requires_grad,
    and reading them builds no graph."""
    def run(out, native):
        if not native:
            monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1).to(torch.bfloat16))
        x = torch.randn(3, 4, requires_grad=True)
        with DumpSession(net, out=out, store=False, auto_step=False, quiet=True) as s:
            assert bool(s.adapter._native) is native
            y = net[2](net[1](net[0](x)).to(torch.bfloat16)).float().sum()
            (g,) = torch.autograd.grad(y, x, create_graph=True)
            g.pow(2).sum().backward()
        monkeypatch.undo()
        return next(out.rglob("dump.json")).read_bytes()

    native, python = run(tmp_path / "native", True), run(tmp_path / "python", False)
    assert native == python
    assert b'"requires_grad": true' in native or b'"requires_grad":true' in native


class _LeafOut(nn.Module):
    """Returns its own parameter: an output without an autograd node (a Python hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.w


class _SparseIn(nn.Module):
    """Takes a sparse tensor that requires grad: no capture of its inputs (autograd cannot
    pass it through a Python Function), reported once; its entry comes from its outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4))

    def forward(self, sp):
        return torch.sparse.mm(sp, self.w)


@needs_native
def test_the_python_hooks_beside_the_native_ones_keep_the_order(tmp_path, monkeypatch):
    """A leaf output gets a Python hook in native mode (what the C++ hooks queued before it is
    replayed first; its gradient, the parameter's too, read as the queued one is: one tensor
    id), a sparse input's gradient an entry with nothing read: the dump is the Python hooks'
    one, and the training goes on (the sparse input broke the forward pass before 2026-11-28)."""
    def run(out, native):
        if not native:
            monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
        torch.manual_seed(0)
        net = nn.ModuleDict({"sparse": _SparseIn(), "lin": nn.Linear(4, 4), "leaf": _LeafOut()})
        sp = torch.randn(3, 8).relu().to_sparse().requires_grad_()
        with DumpSession(net, out=out, store=False, auto_step=False, quiet=True) as s:
            assert bool(s.adapter._native) is native
            for _ in range(2):
                h = net["lin"](net["sparse"](sp))
                (h * net["leaf"](h)).sum().backward()
                s.step()
        monkeypatch.undo()
        return [p.read_bytes() for p in sorted(out.rglob("dump.json"))]

    native, python = run(tmp_path / "native", True), run(tmp_path / "python", False)
    assert len(python) >= 2 and native == python
    data = json.loads(python[0])["data"]
    assert {"Module.sparse._SparseIn.backward.0", "Module.leaf._LeafOut.parameters_grad.0"} <= set(data)
    # the sparse input's gradient: an entry, nothing read (no statistics, no tensor id)
    assert data["Module.sparse._SparseIn.backward.0"]["output"] == [
        {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [3, 8], "Max": None,
         "Min": None, "Mean": None, "Norm": None, "requires_grad": False}]
    # the leaf output's gradient is the parameter's .grad in step 0: one tensor, one id (in both
    # paths); in step 1 (no zero_grad) .grad holds both steps' gradients: another tensor
    leaf_out = data["Module.leaf._LeafOut.backward.0"]["input"][0]
    assert leaf_out["tensor_id"] == data["Module.leaf._LeafOut.parameters_grad.0"]["w"][0]["tensor_id"]
    later = json.loads(python[1])["data"]
    assert later["Module.leaf._LeafOut.parameters_grad.0"]["w"][0]["Max"] == pytest.approx(
        2 * later["Module.leaf._LeafOut.backward.0"]["input"][0]["Max"])


@needs_native
def test_a_users_hook_on_a_parameter_leaves_the_capture_of_its_gradient(tmp_path):
    """A tensor's first Python hook clears the tensor's other hooks, C++ ones included: the
    capture hooks the parameter's AccumulateGrad node instead, which keeps its hooks."""
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    seen = []
    with DumpSession(net, out=tmp_path, store=False, auto_step=False, quiet=True) as s:
        assert s.adapter._native
        net[0].weight.register_hook(lambda g: seen.append(g.shape))     # after the dump attached
        net(torch.randn(2, 4)).sum().backward()
    data = json.loads(next(tmp_path.rglob("dump.json")).read_text())["data"]
    assert seen == [torch.Size([4, 4])]
    assert set(data["Module.0.Linear.parameters_grad.0"]) == {"weight", "bias"}


@needs_native
def test_the_native_capture_is_used_for_the_module_levels_statistics_only(tmp_path):
    net = nn.Linear(4, 2)
    for level, task, native in (("module", "statistics", True), ("mix", "statistics", False),
                                ("module", "tensor", False), ("module", "md5", False),
                                ("module", "overflow", False)):
        with DumpSession(net, out=tmp_path / f"{level}-{task}", level=level, task=task,
                         store=False, auto_step=False, quiet=True) as s:
            assert bool(s.adapter._native) is native, (level, task)
            net(torch.randn(2, 4)).sum().backward()


@needs_native
def test_a_detached_dump_leaves_no_hook_that_records(tmp_path):
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    with DumpSession(net, out=tmp_path, store=False, auto_step=False, quiet=True) as s:
        native = s.adapter._native
        net(torch.randn(2, 4)).sum().backward()
    assert native.pending() == 0
    x = torch.randn(2, 4)
    y = net(x)
    with DumpSession(nn.Linear(2, 2), out=tmp_path / "other", store=False, auto_step=False, quiet=True) as s:
        y.sum().backward()                   # the first dump's parameters: hooks removed
        assert s.adapter._native.pending() == 0
    assert [p.name for p in tmp_path.iterdir()] != []


def test_without_the_library_the_python_hooks_record_the_same_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    with DumpSession(net, out=tmp_path, store=False, auto_step=False, quiet=True) as s:
        assert not s.adapter._native
        net(torch.randn(3, 4)).sum().backward()
    data = json.loads(next(tmp_path.rglob("dump.json")).read_text())["data"]
    assert {"Module.0.Linear.backward.0", "Module.0.Linear.parameters_grad.0"} <= set(data)


@needs_native
@pytest.mark.parametrize("native", [True, False])
def test_a_model_found_at_its_first_call_has_its_first_steps_backward(tmp_path, monkeypatch, native):
    """A script's model is attached when its first forward call starts (``watch_models``),
    after step 0 began: the C++ capture made then records step 0 too (it recorded nothing
    until step 1: step 0 had its forward entries and no backward, no parameter gradient)."""
    if not native:
        monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with DumpSession(None, out=tmp_path, quiet=True) as s:      # no model: found as it runs
        for _ in range(2):
            opt.zero_grad()
            net(torch.randn(2, 4)).sum().backward()
            opt.step()                                          # (auto_step: the optimizer's)
        used = s.adapter._native
    assert bool(used) == native
    steps = [json.loads((tmp_path / f"step{i}/rank0/dump.json").read_text())["data"] for i in (0, 1)]
    assert list(steps[0]) == list(steps[1])
    assert "Module.0.Linear.parameters_grad.0" in steps[0] and "Module.2.Linear.backward.0" in steps[0]


@pytest.mark.parametrize("native", [True, False])
def test_a_parameters_gradient_is_its_grad_after_accumulation_as_msprobe_records_it(tmp_path, monkeypatch,
                                                                                    native):
    """msprobe's ``parameters_grad.N`` is the parameter's ``.grad`` read after the N-th
    micro-batch's gradient was added (a post-hook on its AccumulateGrad node): under gradient
    accumulation entry 1 is the sum of both micro-batches, what the optimizer uses, and the
    last entry of a step equals the ``.grad`` the optimizer steps with."""
    if native and not torch_grads.available():
        pytest.skip("the C++ capture cannot be built here")
    if not native:
        monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
        monkeypatch.setattr(torch_grads, "hooks", lambda prepared=False: None)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    batches = [torch.randn(3, 4) for _ in range(2)]
    seen = []
    with DumpSession(net, out=tmp_path, store=False, auto_step=False, quiet=True) as s:
        assert bool(s.adapter._native) is native
        for x in batches:
            net(x).sum().backward()
            seen.append(net[0].weight.grad.clone())
        s.step()
    data = json.loads(next(tmp_path.rglob("dump.json")).read_text())["data"]
    for n, grad in enumerate(seen):
        entry = data[f"Module.0.Linear.parameters_grad.{n}"]["weight"][0]
        assert entry["Max"] == pytest.approx(grad.max().item(), rel=1e-6)
        assert entry["Norm"] == pytest.approx(grad.norm().item(), rel=1e-5)
    assert not torch.equal(seen[0], seen[1])
