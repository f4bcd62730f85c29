"""Tensor-mode metrics read from the dumped files without torch, bfloat16 ones included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from probe.compare.metrics import load_array


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
    from probe.compare.api import compare
    from probe.dumper.session import DumpSession

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


# -- msprobe's PyTorch tensor files (torch.save), read without torch ---------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int32, torch.uint8, torch.bool])
def test_a_torch_save_file_is_read_as_its_values(tmp_path, dtype):
    from probe.compare.pt_reader import read_pt

    t = (torch.randn(6, 5, generator=torch.Generator().manual_seed(2)) * 10).to(dtype)
    path = tmp_path / "t.pt"
    torch.save(t, path)
    got = read_pt(str(path))
    want = t.float().numpy() if dtype == torch.bfloat16 else t.numpy()
    assert got.shape == (6, 5) and np.array_equal(got, want)


def test_a_saved_view_is_read_with_its_offset_and_strides(tmp_path):
    from probe.compare.metrics import load_array

    base = torch.arange(60.0).reshape(6, 10)
    view = base[1:5, 2:9:3].t()                   # offset, step and transpose over one storage
    torch.save(view, tmp_path / "v.pt")
    assert np.array_equal(load_array(str(tmp_path / "v.pt")), view.numpy())


class _Boom:
    def __reduce__(self):
        import os
        return (os.system, ("echo pwned > /dev/null",))


@pytest.mark.parametrize("what", ["code", "dict", "not a zip", "missing storage"])
def test_a_pt_file_that_is_not_one_tensor_is_none_and_runs_nothing(tmp_path, what):
    import zipfile

    from probe.compare.pt_reader import read_pt

    path = tmp_path / "x.pt"
    if what == "code":
        torch.save(_Boom(), path)                 # a pickle that would call os.system
    elif what == "dict":
        torch.save({"a": torch.ones(2)}, path)
    elif what == "not a zip":
        path.write_bytes(b"\x80\x02}q\x00.")
    else:
        torch.save(torch.ones(3), path)
        with zipfile.ZipFile(path) as z:
            names = {n: z.read(n) for n in z.namelist()}
        with zipfile.ZipFile(path, "w") as z:
            for n, b in names.items():
                if "/data/" not in n:
                    z.writestr(n, b)
    assert read_pt(str(path)) is None


def test_an_expanded_tensor_is_read_whole_and_a_storage_of_the_wrong_size_is_refused(tmp_path):
    import zipfile

    from probe.compare.pt_reader import read_pt

    torch.save(torch.arange(3.0).reshape(3, 1).expand(3, 4), tmp_path / "e.pt")   # stride 0
    assert np.array_equal(read_pt(str(tmp_path / "e.pt")), np.repeat(np.arange(3.0)[:, None], 4, 1))
    torch.save(torch.ones(8), tmp_path / "s.pt")
    with zipfile.ZipFile(tmp_path / "s.pt") as z:
        names = {n: z.read(n) for n in z.namelist()}
    with zipfile.ZipFile(tmp_path / "s.pt", "w") as z:
        for n, b in names.items():
            z.writestr(n, b[:-4] if "/data/" in n else b)     # the storage one element short
    assert read_pt(str(tmp_path / "s.pt")) is None
