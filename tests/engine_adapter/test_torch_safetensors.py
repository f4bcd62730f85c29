"""The dump's own safetensors writer writes what safetensors' save_file writes, byte for byte."""

import os

import pytest
import torch
from safetensors.torch import save_file

from probe.engine_adapter.torch_safetensors import write_tensor
from probe.engine_adapter.torch_stats import TorchStats

CASES = {
    "matrix": torch.randn(2, 3),
    "scalar": torch.tensor(1.5),
    "empty": torch.zeros(0, 4),
    "bf16": torch.randn(3).to(torch.bfloat16),
    "half": torch.randn(7).half(),
    "bool": torch.tensor([True, False, True]),
    "int8": torch.randint(-5, 5, (3, 3), dtype=torch.int8),
    "int64": torch.arange(10),
    "float64": torch.randn(2, 3, dtype=torch.float64),
    "transposed": torch.randn(4, 5).t(),
    "strided": torch.randn(3, 4)[:, 1],
    "needs-grad": torch.randn(5, 6, requires_grad=True),
    "parameter": torch.nn.Parameter(torch.randn(3)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bytes_equal_save_file(tmp_path, name):
    t = CASES[name]
    ref, ours = tmp_path / "ref.safetensors", tmp_path / "ours.safetensors"
    save_file({"tensor": t.detach().contiguous()}, str(ref))
    assert write_tensor(t, str(ours))
    assert ours.read_bytes() == ref.read_bytes()


def test_snapshot_keeps_the_data_of_its_moment(tmp_path):
    stats = TorchStats()
    t = torch.arange(6.0).reshape(2, 3).t()
    copy = stats.snapshot(t)
    t.mul_(0)                      # the step goes on and changes the tensor in place
    stats.save({"tensor": copy}, str(tmp_path / "a.safetensors"))
    from safetensors.torch import load_file
    assert load_file(str(tmp_path / "a.safetensors"))["tensor"].tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def test_a_planted_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    os.symlink(target, tmp_path / "link.safetensors")
    with pytest.raises(OSError):
        TorchStats().save({"tensor": torch.ones(2)}, str(tmp_path / "link.safetensors"))
    assert not target.exists()


def test_an_unhandled_dtype_is_left_to_save_file(tmp_path):
    t = torch.ones(2, dtype=torch.complex64)
    assert write_tensor(t, str(tmp_path / "c.safetensors")) is False
    assert TorchStats().snapshot(t) is None
