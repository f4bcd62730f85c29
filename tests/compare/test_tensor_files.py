"""Tensor-mode metrics read from the dumped files without torch, bfloat16 ones included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from compare.metrics import load_array


def _bf16(tmp_path, t: torch.Tensor, name="x.safetensors"):
    path = tmp_path / name
    save_file({"tensor": t}, str(path))
    return str(path)


def test_a_bfloat16_file_is_read_as_its_float32_values(tmp_path):
    t = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).bfloat16()
    t[0, 0], t[0, 1] = float("inf"), float("nan")
    got = load_array(_bf16(tmp_path, t))
    assert got.dtype == np.float32 and got.shape == (5, 7)
    want = t.float().numpy()
    assert np.array_equal(got[1:], want[1:]) and got[0, 0] == np.inf and np.isnan(got[0, 1])


@pytest.mark.parametrize("damage", ["truncated", "header", "two tensors"])
def test_a_damaged_or_foreign_bfloat16_file_keeps_the_rows_statistics(tmp_path, damage):
    t = torch.randn(64).bfloat16()
    path = _bf16(tmp_path, t)
    raw = open(path, "rb").read()
    if damage == "truncated":
        open(path, "wb").write(raw[:-10])
    elif damage == "header":
        open(path, "wb").write((10**12).to_bytes(8, "little") + raw[8:])
    else:
        save_file({"a": t, "b": t.clone()}, path)
    assert load_array(path) is None


def test_a_tensor_dump_of_a_bfloat16_model_compares_element_by_element(tmp_path):
    """Every row of two tensor-task dumps of a bfloat16 network gets its cosine (none did: NumPy
    has no bfloat16, and the rows kept their statistics only)."""
    from compare.api import compare
    from probe.session import DumpSession

    def dump(scale: float, out):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 4)).bfloat16()
        with torch.no_grad():
            net[2].weight.mul_(scale)
        with DumpSession(net, out=str(out), level="module", task="tensor", auto_step=False,
                         store=False, quiet=True):
            net(torch.ones(3, 8, dtype=torch.bfloat16)).float().sum().backward()
        return str(out)

    rows = compare(dump(1.0, tmp_path / "a"), dump(1.05, tmp_path / "b")).rows.to_pylist()
    assert rows and all(r["cosine"] is not None for r in rows)
    weight = next(r for r in rows if r["name_a"] == "Module.2.Linear.forward.0.parameters.weight")
    assert weight["cosine"] == pytest.approx(1.0, abs=1e-5) and weight["max_rel_err"] == pytest.approx(0.05, abs=0.01)
