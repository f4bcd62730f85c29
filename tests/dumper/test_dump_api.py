"""The dump's Python API on small PyTorch networks: msprobe layout, statistics, filters, safety."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from probe.dumper.session import DumpSession


class TinyAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        a = self.softmax(q @ k.transpose(-1, -2) / math.sqrt(x.shape[-1]))
        return self.o(a @ v)


class TinyNet(nn.Module):
    """The TinyNet of the real msprobe dumps (16 -> 32 -> 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.block = nn.Module()
        self.block.ln1 = nn.LayerNorm(32)
        self.block.attn = TinyAttention(32)
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.block.attn(self.block.ln1(h))
        return self.head(h)


def _load(out: Path, step: int = 0, rank: int = 0) -> dict:
    return json.loads((out / f"step{step}" / f"rank{rank}" / "dump.json").read_text())


def _train(net, steps: int, session: DumpSession | None = None, x=None):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    torch.manual_seed(1)
    x = torch.randn(4, 6, 16) if x is None else x
    for _ in range(steps):
        loss = net(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if session is not None:
            session.step()


def test_module_level_writes_msprobe_keys_layout_and_header(tmp_path):
    torch.manual_seed(0)
    net = TinyNet()
    with DumpSession(net, out=tmp_path, level="module", store=False, auto_step=False) as s:
        _train(net, 1, s)
    dump = _load(tmp_path)
    assert {k: dump[k] for k in ("task", "level", "framework", "dump_data_dir")} == {
        "task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None}
    data = dump["data"]
    fwd = data["Module.block.attn.q.Linear.forward.0"]
    assert list(fwd) == ["input_args", "input_kwargs", "output", "parameters"]
    assert list(fwd["input_args"][0]) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm",
                                          "requires_grad", "tensor_id"]   # msprobe's keys, then ours
    assert fwd["input_args"][0]["shape"] == [4, 6, 32] and fwd["input_args"][0]["dtype"] == "torch.float32"
    assert set(fwd["parameters"]) == {"weight", "bias"}
    bwd = data["Module.block.attn.q.Linear.backward.0"]
    assert list(bwd) == ["input", "output"] and bwd["input"][0]["shape"] == [4, 6, 32]
    grads = data["Module.head.Linear.parameters_grad.0"]
    assert set(grads) == {"weight", "bias"} and grads["weight"][0]["shape"] == [8, 32]
    # the root module is not an entry; a parent module is, after its children (msprobe order)
    keys = list(data)
    assert not any(k.startswith("Module.TinyNet") for k in keys)
    assert keys.index("Module.block.attn.q.Linear.forward.0") < keys.index(
        "Module.block.attn.TinyAttention.forward.0")
    construct = json.loads((tmp_path / "step0/rank0/construct.json").read_text())
    assert construct["Module.block.attn.q.Linear.forward.0"] == "Module.block.attn.TinyAttention.forward.0"
    assert construct["Module.embed.Linear.forward.0"] is None
    stack = json.loads((tmp_path / "step0/rank0/stack.json").read_text())
    named = {n for group in stack.values() for n in group[0]}
    assert "Module.embed.Linear.forward.0" in named
    assert any("test_dump_api.py" in line for group in stack.values() for line in group[1])


def test_statistics_equal_torch_reductions_for_inputs_outputs_and_gradients(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(5, 3)
    net = nn.Sequential(lin)
    x = torch.randn(7, 5, requires_grad=True)
    with DumpSession(net, out=tmp_path, store=False, auto_step=False):
        y = net(x)
        y.sum().backward()
    data = _load(tmp_path)["data"]
    inp = data["Module.0.Linear.forward.0"]["input_args"][0]
    out = data["Module.0.Linear.forward.0"]["output"][0]
    for rec, t in ((inp, x), (out, y)):
        t = t.detach()
        assert rec["Max"] == pytest.approx(t.max().item(), rel=1e-6)
        assert rec["Min"] == pytest.approx(t.min().item(), rel=1e-6)
        assert rec["Mean"] == pytest.approx(t.mean().item(), rel=1e-5, abs=1e-7)
        assert rec["Norm"] == pytest.approx(t.norm().item(), rel=1e-5)
    wgrad = data["Module.0.Linear.parameters_grad.0"]["weight"][0]
    assert wgrad["Norm"] == pytest.approx(lin.weight.grad.norm().item(), rel=1e-5)
    bwd = data["Module.0.Linear.backward.0"]
    assert bwd["input"][0]["Max"] == 1.0 and bwd["output"][0]["shape"] == [7, 5]


def test_nan_inf_counts_reach_the_store_and_json_keeps_raw_values(tmp_path):
    from probe.collectors.store import open_store

    net = nn.Sequential(nn.Identity())
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    with DumpSession(net, out=tmp_path, auto_step=False):
        net(x)
    rec = _load(tmp_path)["data"]["Module.0.Identity.forward.0"]["input_args"][0]
    assert math.isnan(rec["Mean"])
    row = open_store(tmp_path).sql(
        "select nan_count, inf_count, numel from tensors where slot = 'input'").fetchall()[0]
    assert row == (1, 2, 5)


def test_int_bool_complex_tensors_get_dtype_and_shape_without_bogus_statistics(tmp_path):
    class Takes(nn.Module):
        def forward(self, ids, mask, z, empty):
            return ids.float()

    net = nn.Sequential()
    net.add_module("takes", Takes())
    ids = torch.tensor([[3, 9], [0, 4]])
    with DumpSession(net, out=tmp_path, store=False, auto_step=False):
        net.takes(ids, torch.tensor([True, False]), torch.ones(3, dtype=torch.complex64), torch.ones(0))
    args = _load(tmp_path)["data"]["Module.takes.Takes.forward.0"]["input_args"]
    assert (args[0]["Max"], args[0]["Min"], args[0]["Mean"], args[0]["Norm"]) == (9, 0, None, None)
    for rec, dtype, shape in ((args[1], "torch.bool", [2]), (args[2], "torch.complex64", [3]),
                              (args[3], "torch.float32", [0])):
        assert rec["dtype"] == dtype and rec["shape"] == shape
        assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == (None, None, None, None)


def test_api_level_names_match_msprobe_and_record_backward(tmp_path):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    with DumpSession(None, out=tmp_path, level="api", store=False, auto_step=False):
        y = torch.nn.functional.linear(x, lin.weight, lin.bias)
        z = torch.matmul(y * 2, y.transpose(0, 1))
        z.sum().backward()
    data = _load(tmp_path)["data"]
    for name in ("Functional.linear.0.forward", "Tensor.__mul__.0.forward", "Torch.matmul.0.forward",
                 "Tensor.transpose.0.forward", "Functional.linear.0.backward", "Torch.matmul.0.backward"):
        assert name in data, name
    fwd = data["Functional.linear.0.forward"]
    assert list(fwd) == ["input_args", "input_kwargs", "output"]
    assert len(fwd["input_args"]) == 3 and fwd["output"][0]["shape"] == [2, 4]
    mul = data["Tensor.__mul__.0.forward"]["input_args"]
    assert mul[1] == {"type": "int", "value": 2}
    bwd = data["Functional.linear.0.backward"]
    assert bwd["input"][0]["shape"] == [2, 4]
    assert [g["shape"] for g in bwd["output"]] == [[2, 4], [4, 4], [4]]
    assert dump_level(tmp_path) == "L1"
    # the dump's own reductions are never recorded as APIs
    assert not any(k.startswith(("Torch.aminmax", "Torch.dot", "Torch.stack")) for k in data)


def dump_level(out: Path) -> str:
    return _load(out)["level"]


def test_inplace_op_records_its_input_as_it_was_at_the_call(tmp_path):
    x = torch.zeros(3)
    with DumpSession(None, out=tmp_path, level="api", store=False, auto_step=False):
        x.add_(5.0)
        x += 1
    data = _load(tmp_path)["data"]
    add = data["Tensor.add_.0.forward"]
    assert add["input_args"][0]["Max"] == 0.0 and add["output"][0]["Max"] == 5.0
    iadd = data["Tensor.__iadd__.0.forward"]
    assert iadd["input_args"][0]["Max"] == 5.0 and iadd["output"][0]["Max"] == 6.0


def test_mix_level_nests_apis_under_their_module_in_construct(tmp_path):
    torch.manual_seed(0)
    net = TinyNet()
    with DumpSession(net, out=tmp_path, level="mix", store=False, auto_step=False) as s:
        _train(net, 1, s)
    construct = json.loads((tmp_path / "step0/rank0/construct.json").read_text())
    assert construct["Functional.linear.0.forward"] == "Module.embed.Linear.forward.0"
    assert construct["Functional.softmax.0.forward"] == "Module.block.attn.softmax.Softmax.forward.0"
    assert construct["Functional.linear.1.backward"] == "Module.block.attn.q.Linear.backward.0"
    assert _load(tmp_path)["level"] == "mix"


def test_steps_ranks_scope_and_list_filters_select_what_is_written(tmp_path):
    torch.manual_seed(0)
    net = TinyNet()
    with DumpSession(net, out=tmp_path / "a", steps="1,3", scope=r"block\.attn\.[qk]\b",
                     store=False, auto_step=True):
        _train(net, 5)
    assert sorted(p.name for p in (tmp_path / "a").glob("step*")) == ["step1", "step3"]
    keys = set(_load(tmp_path / "a", 1)["data"])
    assert keys and all(".attn.q." in k or ".attn.k." in k for k in keys)
    with DumpSession(net, out=tmp_path / "b", names=["head", "LayerNorm"], store=False, auto_step=True):
        _train(net, 1)
    keys = {k.split(".forward")[0].split(".backward")[0].split(".parameters_grad")[0]
            for k in _load(tmp_path / "b")["data"]}
    assert keys == {"Module.head.Linear", "Module.block.ln1.LayerNorm"}
    with DumpSession(net, out=tmp_path / "c", ranks=[1], store=False, auto_step=True):
        _train(net, 1)
    assert not list((tmp_path / "c").glob("step*"))


def test_md5_and_tensor_tasks_write_hashes_and_msprobes_tensor_files_inside_out(tmp_path):
    from safetensors.torch import load_file

    net = nn.Sequential(nn.Linear(3, 2))
    x = torch.ones(1, 3)
    with DumpSession(net, out=tmp_path / "m", task="md5", store=False, auto_step=False):
        net(x)
    with DumpSession(net, out=tmp_path / "m2", task="md5", store=False, auto_step=False):
        net(x)
    a = _load(tmp_path / "m")["data"]["Module.0.Linear.forward.0"]["output"][0]["md5"]
    b = _load(tmp_path / "m2")["data"]["Module.0.Linear.forward.0"]["output"][0]["md5"]
    assert len(a) == 8 and a == b
    with DumpSession(net, out=tmp_path / "t", task="tensor", store=False, auto_step=False):
        y = net(x)
    dump = _load(tmp_path / "t")
    rec = dump["data"]["Module.0.Linear.forward.0"]["output"][0]
    folder = Path(dump["dump_data_dir"])
    assert folder.parent == tmp_path / "t" / "step0" / "rank0"
    assert rec["data_name"] == "Module.0.Linear.forward.0.output.0.pt"     # msprobe's name and format
    saved = torch.load(folder / rec["data_name"], weights_only=True)
    assert torch.equal(saved, y.detach())
    from probe.compare.pt_reader import read_pt                            # read without torch too
    assert (read_pt(str(folder / rec["data_name"])) == y.detach().numpy()).all()
    with DumpSession(net, out=tmp_path / "s", task="tensor", tensor_format="safetensors",
                     store=False, auto_step=False):
        y = net(x)
    dump = _load(tmp_path / "s")
    rec = dump["data"]["Module.0.Linear.forward.0"]["output"][0]
    folder = Path(dump["dump_data_dir"])
    assert rec["data_name"] == "Module.0.Linear.forward.0.output.0.safetensors"
    assert torch.equal(load_file(str(folder / rec["data_name"]))["tensor"], y.detach())
    assert not any(p.suffix in (".pt", ".pkl") for p in folder.iterdir())


def test_module_names_with_path_separators_never_escape_out(tmp_path):
    evil = type("../../../escape", (nn.Linear,), {})   # class names may hold anything
    net = nn.Module()
    net.add_module("up", evil(2, 2))
    net.add_module("a/b\\c", nn.Linear(2, 2))
    out = tmp_path / "out"
    with DumpSession(net, out=out, task="tensor", store=False, auto_step=False):
        for m in net.children():
            m(torch.ones(1, 2))
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all(out in p.parents for p in written)
    assert len(list((out / "step0/rank0/dump_tensor_data").iterdir())) == 2 * 4


def test_exception_in_the_model_leaves_every_finished_step_readable(tmp_path):
    torch.manual_seed(0)

    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("model exploded")
            return self.lin(x)

    net = Boom()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="exploded"):
        with DumpSession(net, out=tmp_path, store=True, auto_step=True):
            for _ in range(5):
                net(torch.ones(2, 4)).sum().backward()
                opt.step()
    for step in (0, 1):
        assert "Module.lin.Linear.forward.0" in _load(tmp_path, step)["data"]
    from probe.collectors.store import open_store
    steps = open_store(tmp_path).sql("select distinct step from tensors order by step").fetchall()
    assert [s for (s,) in steps][:2] == [0, 1]


def test_exception_inside_dump_code_is_reported_once_and_training_goes_on(tmp_path, logged, monkeypatch):
    from probe.dumper.tree import CallTree

    net = nn.Sequential(nn.Linear(2, 2))
    session = DumpSession(net, out=tmp_path, store=False, auto_step=False)
    session.start()

    def broken(self, base, key):
        raise ValueError("stats backend broke")
    monkeypatch.setattr(CallTree, "module_call", broken)
    for _ in range(3):
        y = net(torch.ones(1, 2))
        y.sum().backward()
        session.step()
    session.stop()
    err = logged()
    assert err.count("stats backend broke") == 1
    assert y.shape == (1, 2)


def test_hooks_are_removed_on_stop(tmp_path):
    net = nn.Sequential(nn.Linear(2, 2))
    orig_linear = torch.nn.functional.linear
    with DumpSession(net, out=tmp_path, level="mix", store=False, auto_step=False):
        assert torch.nn.functional.linear is not orig_linear
    assert torch.nn.functional.linear is orig_linear
    lin = net[0]
    assert not lin._forward_pre_hooks and not lin._forward_hooks and not lin._backward_hooks


def test_probe_module_exposes_start_step_stop_lazily(tmp_path):
    import probe

    net = nn.Sequential(nn.Linear(2, 2))
    probe.start(net, out=str(tmp_path), auto_step=False, store=False)
    net(torch.ones(1, 2))
    probe.step()
    net(torch.ones(1, 2))
    probe.stop()
    assert sorted(p.name for p in tmp_path.glob("step*")) == ["step0", "step1"]


def test_compiled_blocks_keep_every_module_boundary_and_say_so(tmp_path, monkeypatch):
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    from probe.engine_adapter.torch_adapter import TorchAdapter

    # (the default leaves compiled graphs whole: tests/engine_adapter/test_real_models.py)
    monkeypatch.setattr(TorchAdapter, "keep_compiled_boundaries", True)

    from probe.engine.config import get_preset
    from probe.engine.data import make_batch
    from probe.engine.models import build_model, init_reference_state

    cfg = get_preset("tiny")
    model = build_model("fused", cfg)
    model.load_reference_state(init_reference_state(cfg, 0))
    model.compile_blocks(backend="eager")     # Dynamo graphs without code generation: fast
    counters.clear()
    with DumpSession(model, out=tmp_path, store=False, auto_step=False, quiet=True) as s:
        tokens, targets = make_batch(cfg, 0, 0, 1, 0, None)
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        notes = s.notes()
    assert any("compiled model" in n and "module boundaries kept" in n for n in notes)
    assert counters["stats"]["unique_graphs"] > 0          # the blocks still ran compiled
    keys = set(_load(tmp_path)["data"])
    hooked = {f"Module.{n}.{type(m).__name__}.forward.0" for n, m in model.named_modules()
              if n and not isinstance(m, (nn.ModuleList, nn.ModuleDict))}
    assert hooked <= keys
    assert "Module.decoder.layers.1.self_attention.linear_qkv.Linear.backward.0" in keys


def test_a_non_finite_float_argument_is_written_as_msprobe_writes_it(tmp_path):
    x = torch.tensor([1.0, 2.0])
    with DumpSession(out=tmp_path, level="api", store=False, auto_step=False):
        torch.clamp(x, min=float("-inf"), max=float("nan"))
    text = next(tmp_path.rglob("dump.json")).read_text()
    assert "-Infinity" in text and "NaN" in text and "null" not in text.split('"data"')[1]
    kwargs = _load(tmp_path)["data"]["Torch.clamp.0.forward"]["input_kwargs"]
    assert kwargs["min"]["value"] == -math.inf and math.isnan(kwargs["max"]["value"])


def test_output_gradients_are_let_go_once_their_module_is_recorded(tmp_path):
    """The dump holds a module's output gradient only until the module's backward entry is
    written, not until the whole backward ends (that had made backward allocate fresh memory)."""
    import weakref

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    refs, alive_at_first_layer = [], []
    with DumpSession(net, out=tmp_path, store=False, auto_step=False):
        y = net(x)
        y.register_hook(lambda g: refs.append(weakref.ref(g)))      # the last Linear's output grad
        net[0].weight.register_hook(lambda g: alive_at_first_layer.append(refs[0]() is not None))
        y.sum().backward()
    assert refs and alive_at_first_layer == [False]
    assert "Module.4.Linear.backward.0" in _load(tmp_path)["data"]


def test_a_retained_graph_backed_through_twice_gives_two_backward_entries(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with DumpSession(net, out=tmp_path, store=False, auto_step=False):
        loss = net(x).pow(2).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    data = _load(tmp_path)["data"]
    for name in ("Module.0.Linear", "Module.2.Linear"):
        assert f"{name}.backward.0" in data and f"{name}.backward.1" in data, sorted(data)
        assert (data[f"{name}.backward.1"]["input"][0]["Norm"]
                == pytest.approx(data[f"{name}.backward.0"]["input"][0]["Norm"]))


def test_probe_dump_stays_the_context_manager_after_the_session_module_is_imported():
    import importlib

    import probe
    importlib.import_module("probe.dumper.session")
    importlib.import_module("probe.commands.dump")
    assert callable(probe.dump) and probe.dump.__name__ == "dump"
    assert callable(probe.start) and callable(probe.stop) and callable(probe.step)


def test_a_call_with_several_differentiable_inputs_records_each_inputs_gradient(tmp_path):
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, 2, requires_grad=True)
    with DumpSession(None, out=tmp_path, level="api", store=False, auto_step=False):
        out = torch.matmul(a, b)
        (out * out).sum().backward()
    data = _load(tmp_path)["data"]
    bwd = data["Torch.matmul.0.backward"]
    grad_out = 2 * (a @ b).detach()
    assert bwd["input"][0]["Norm"] == pytest.approx(float(grad_out.norm()))
    assert [g["shape"] for g in bwd["output"]] == [[3, 4], [4, 2]]
    assert bwd["output"][0]["Norm"] == pytest.approx(float(a.grad.norm()))
    assert bwd["output"][1]["Norm"] == pytest.approx(float(b.grad.norm()))


def test_a_backward_of_only_some_inputs_is_recorded_when_the_step_ends(tmp_path):
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    with DumpSession(None, out=tmp_path, level="api", store=False, auto_step=False):
        out = torch.mul(a, b)
        (grad_a,) = torch.autograd.grad(out.sum(), [a])     # b's gradient is never computed
        del out                     # the graph, and the hooks on it, are gone before the step ends
    bwd = _load(tmp_path)["data"]["Torch.mul.0.backward"]
    assert [g["Norm"] for g in bwd["output"]] == [pytest.approx(float(grad_a.norm()))]


@pytest.mark.parametrize("auto_step", [True, False])
def test_the_step_left_open_after_the_last_one_is_not_written_one_with_calls_is(tmp_path, auto_step):
    """After the last optimizer step (or ``step()``) the next step is open; a session stopped
    then writes the steps that ran and no empty one after them (the CLI did this already, the
    Python API wrote an empty step folder); a step in flight with calls in it is written."""
    torch.manual_seed(0)
    net = TinyNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with DumpSession(net, out=tmp_path / "a", auto_step=auto_step, quiet=True) as s:
        for _ in range(2):
            opt.zero_grad()
            net(torch.randn(2, 16)).sum().backward()
            opt.step()
            if not auto_step:
                s.step()
    assert s.steps_written == [0, 1]
    assert sorted(p.name for p in (tmp_path / "a").glob("step*")) == ["step0", "step1"]
    with DumpSession(net, out=tmp_path / "b", auto_step=auto_step, quiet=True) as s:
        opt.zero_grad()
        net(torch.randn(2, 16)).sum().backward()
        opt.step()
        if not auto_step:
            s.step()
        net(torch.randn(2, 16))                    # a forward pass, no step after it
    assert s.steps_written == [0, 1]
    data = json.loads((tmp_path / "b/step1/rank0/dump.json").read_text())["data"]
    assert list(data) == ["Module.embed.Linear.forward.0", "Module.block.ln1.LayerNorm.forward.0",
                          *[k for k in data if ".attn." in k], "Module.head.Linear.forward.0"]


def test_a_plain_dataclass_output_is_recorded_field_by_field(tmp_path):
    """A module returning a plain ``@dataclass`` (not a dict like HF's ``ModelOutput``) has its
    fields recorded as a dict of their values (it was ``[null]``), and its backward entry."""
    from dataclasses import dataclass, field

    @dataclass
    class Out:
        logits: torch.Tensor
        aux: torch.Tensor
        note: str = "x"
        _cache: list = field(default_factory=list)

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            h = self.lin(x)
            return Out(logits=h, aux=h.sum(-1))

    net = nn.Sequential(Body())
    with DumpSession(net, out=tmp_path, store=False, auto_step=False, quiet=True) as s:
        out = net(torch.randn(2, 4))
        (out.logits.sum() + out.aux.sum()).backward()
        s.step()
    data = json.loads(next(tmp_path.rglob("dump.json")).read_text())["data"]
    (recorded,) = data["Module.0.Body.forward.0"]["output"]
    assert set(recorded) == {"logits", "aux", "note", "_cache"}
    assert recorded["logits"]["shape"] == [2, 3] and recorded["aux"]["shape"] == [2]
    assert recorded["logits"]["Max"] == pytest.approx(out.logits.max().item())
    assert recorded["note"] == {"type": "str", "value": "x"}
    assert "Module.0.Body.backward.0" in data
