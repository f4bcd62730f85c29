"""The dump's native row builder makes exactly what the Python one makes.

``probe.dumper._rows_native`` (built at install, optional) takes plain tensors and exact
int/float/bool values; everything else goes back to Python. Both paths are run here over the
same values and must give the same entries, rows, leaves, handles, identity table and tensor
ids, step after step.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from probe.engine_adapter.torch_stats import TorchStats
from probe.dumper import rows as rows_module
from probe.dumper.rows import Leaf, RowBuilder, apply_statistics

native = pytest.importorskip("probe.dumper._rows_native", reason="the native row builder is not built")
_native_rows = rows_module._native_rows


def _builder(monkeypatch, use_native: bool) -> RowBuilder:
    monkeypatch.setattr(rows_module, "_native_rows", _native_rows if use_native else lambda builder: None)
    rows = RowBuilder(TorchStats(), want_hash=False, save=None, tensor_ids=True)
    assert (rows._native is not None) == use_native
    return rows


def _values() -> list:
    torch.manual_seed(0)
    base = torch.randn(64, 32)
    param = torch.nn.Parameter(torch.randn(8, 8))
    big = torch.randn(50_000)               # read with the GIL released
    return [
        base, base.t(), base[:, ::2], base.view(-1), big, big,
        torch.tensor([1.0, float("nan")]), torch.tensor([float("inf"), 1.0]),
        torch.tensor([-float("inf"), 2.0], dtype=torch.float64),
        torch.full((3,), 1e30),             # a finite float whose square overflows float32
        torch.arange(10), torch.zeros(0), torch.ones(3, dtype=torch.bool),
        torch.randn(4, dtype=torch.float64), torch.randn(4).half(), torch.randn(4).bfloat16(),
        param, param, base, torch.randn(3, 3, dtype=torch.complex64),
        torch.randn(4, requires_grad=True) * 2, torch.randn(2, 3).to_sparse(),
        3, -7, 10 ** 30, 2.5, -0.0, True, False, float("nan"), float("inf"), "text", None,
        [base, 1, (2.0, None)], {"a": base, "b": 3}, slice(1, 2), torch.float32, torch.Size([2, 3]),
        Ellipsis, object(),
        # layouts: dense in another order (read as they lie), overlapping, gapped, size-1 dims
        torch.randn(2, 3, 4).permute(2, 0, 1), torch.randn(4, 1, 3).transpose(0, 2),
        torch.randn(3, 1).expand(3, 5), torch.randn(6, 4)[::2], torch.randn(5, 1, 1)[:, :, 0],
        torch.randn(1, 4).t(), torch.randn(8).as_strided((2, 2), (1, 2)),
        torch.randn(3, 4, dtype=torch.float64).t(), torch.randn(4, 3).half().t(),
    ]


def _run(rows: RowBuilder, steps: int = 2) -> list:
    values = _values()
    out = []
    for step in range(steps):
        rows.start_step()
        if step:                            # an in-place change: a new version, new statistics
            values[0].add_(1.0)
        entries = [rows.value(v, i, f"Module.n{i}.forward.0", "module", "forward", "input", str(i))
                   for i, v in enumerate(values)]
        gathered = rows.stats.gather(rows.handles)
        stats = apply_statistics(rows.leaves, gathered, len(rows.rows))
        seen = [(key[1:], rec[1:]) for key, rec in rows._seen.items()]
        out.append(repr((entries, rows.rows, [tuple(leaf) for leaf in rows.leaves],
                         {type(leaf) for leaf in rows.leaves}, rows.handles, seen,
                         {k: v.to_pylist() for k, v in stats.items()})))
    return out


def test_the_native_row_builder_makes_what_the_python_one_makes(monkeypatch):
    python = _run(_builder(monkeypatch, False))
    native_rows = _run(_builder(monkeypatch, True))
    assert python == native_rows


def test_native_leaves_are_leaves_and_scalars_are_rows(monkeypatch):
    rows = _builder(monkeypatch, True)
    t = torch.tensor([1.0, -2.0])
    entry = rows.value(t, 0, "n", "api", "forward", "input", "0")
    assert entry["Max"] == 1.0 and entry["Min"] == -2.0 and entry["tensor_id"] == 0
    assert type(rows.leaves[0]) is Leaf and rows.leaves[0].entry is entry
    assert rows.value(5, 1, "n", "api", "forward", "input", "1") == {"type": "int", "value": 5}
    assert rows.rows[-1][6] == "int" and rows.rows[-1][12] == "5"


def test_the_native_builder_and_its_python_half_are_collected(monkeypatch):
    rows = _builder(monkeypatch, True)
    rows.value(torch.ones(2), 0, "n", "api", "forward", "input", "0")
    ref = weakref.ref(rows)
    del rows
    gc.collect()
    assert ref() is None


def test_the_native_statistics_records_give_the_columns_apply_statistics_gives(monkeypatch):
    from probe.dumper.rows import records_statistics

    rows = _builder(monkeypatch, True)
    torch.manual_seed(1)
    base = torch.randn(16, 8)
    values = [base, base.view(-1), torch.randn(50_000), torch.tensor([1.0, float("nan")]),
              torch.tensor([float("inf"), -2.0], dtype=torch.float64), torch.arange(7) - 3,
              torch.zeros(0), torch.ones(2, dtype=torch.bool), torch.full((3,), 1e30), 4, 2.5, None]
    for i, v in enumerate(values):
        rows.value(v, i, f"n{i}", "api", "forward", "input", str(i))
    records = rows.statistics_records()
    assert records is not None and len(records) == 7 * 8 * 8   # 7 leaves with statistics, 8 doubles each
    expected = apply_statistics(rows.leaves, rows.stats.gather(rows.handles), len(rows.rows))
    got = records_statistics(records, len(rows.rows))
    assert {k: repr(v.to_pylist()) for k, v in got.items()} == {k: repr(v.to_pylist()) for k, v in expected.items()}

    class Sub(torch.Tensor):
        pass
    rows.value(torch.randn(3).as_subclass(Sub), 99, "n", "api", "forward", "input", "0")  # Python's
    assert rows.statistics_records() is None


@pytest.mark.parametrize("use_native", [False, True])
def test_a_dense_view_in_another_order_is_read_as_it_lies_with_the_same_statistics(monkeypatch, use_native):
    rows = _builder(monkeypatch, use_native)
    t = torch.randn(3, 4, 5, dtype=torch.float64).permute(2, 0, 1)
    assert not t.is_contiguous()
    entry = rows.value(t, 0, "n", "api", "forward", "input", "0")
    assert (entry["Max"], entry["Min"]) == (float(t.max()), float(t.min()))
    assert entry["Mean"] == pytest.approx(float(t.mean()), rel=1e-12)
    assert entry["Norm"] == pytest.approx(float(t.norm()), rel=1e-12)


def test_a_prepared_gradient_gives_the_entry_and_row_of_its_tensor(monkeypatch):
    """A gradient the C++ capture already read (engine_adapter.torch_grads.PreparedGrad) makes
    the entry and row its tensor makes; one group (the same bytes in the step) shares one
    statistics handle and one tensor id, as one tensor's identity does."""
    from probe.engine_adapter.torch_grads import PreparedGrad
    from probe.engine_adapter.torch_stats import _reduce_host

    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(5, dtype=torch.float64)
    args = (7, "Module.x.Linear.backward.0", "module", "backward", "input", "0")

    def prepared(t, group):
        return PreparedGrad((t.dtype, tuple(t.shape), t.numel(), False, _reduce_host(t, "float"), group))

    direct, given = _builder(monkeypatch, True), _builder(monkeypatch, True)
    assert given.accept_prepared(PreparedGrad)
    want = [direct.value(t, *args) for t in (a, b, a)]
    got = [given.value(p, *args) for p in (prepared(a, 0), prepared(b, 1), prepared(a, 0))]
    assert got == want and got[0]["tensor_id"] == got[2]["tensor_id"] != got[1]["tensor_id"]
    assert given.rows == direct.rows and given.handles == direct.handles
    assert [leaf[1:] for leaf in given.leaves] == [leaf[1:] for leaf in direct.leaves]
    assert bytes(given.statistics_records()) == bytes(direct.statistics_records())
    given.start_step()                      # groups are the step's: a new step, new ids
    assert given.value(prepared(a, 0), *args)["tensor_id"] == 0
    assert not _builder(monkeypatch, False).accept_prepared(PreparedGrad)


def test_a_keyed_prepared_gradient_is_one_tensor_id_with_the_tensor_of_its_bytes(monkeypatch):
    """A gradient handed over read with its identity key (the library's ``prepare``) is found in
    the step's identity table with the tensors read there, both ways: a parameter's gradient
    that autograd hands to .grad as it is, read again by the optimizer, is one tensor id; the
    same bytes after an in-place change are another."""
    from probe.engine_adapter import torch_grads

    hooks = torch_grads.hooks(prepared=True)
    if hooks is None or hooks.prepare is None:
        pytest.skip("the library or the statistics kernel cannot be built here")
    try:
        torch.manual_seed(0)
        g, other = torch.randn(4, 3), torch.randn(4, 3)
        part = g[:, :2]                                  # not dense: its layout is in its key
        args = (7, "Functional.linear.0.backward", "api", "backward", "input", "0")
        direct, given = _builder(monkeypatch, True), _builder(monkeypatch, True)
        assert given.accept_prepared(torch_grads.PreparedGrad)
        p = hooks.prepare(g)
        assert isinstance(p, torch_grads.PreparedGrad) and len(p) == 8
        assert hooks.prepare(torch.arange(3)) is not None and not isinstance(
            hooks.prepare(torch.arange(3)), torch_grads.PreparedGrad)      # an integer: the tensor
        want = [direct.value(t, *args) for t in (g, other, g, part, g.t())]
        got = [given.value(p, *args), given.value(other, *args), given.value(g, *args),
               given.value(hooks.prepare(part), *args), given.value(hooks.prepare(g.t()), *args)]
        assert got == want and got[0]["tensor_id"] == got[2]["tensor_id"] != got[1]["tensor_id"]
        assert got[3]["tensor_id"] == 2 and got[4]["tensor_id"] == 0    # a transpose: g's bytes
        assert given.rows == direct.rows and given.handles == direct.handles
        g.add_(1)                                        # a new version: other bytes, a new id
        assert given.value(hooks.prepare(g), *args)["tensor_id"] == 3
    finally:
        hooks.forget()
