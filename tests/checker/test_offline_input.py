"""Reading a dump for the check: odd and hostile entries become skipped rows with a reason, never a traceback."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from probe.checker.calls import find_steps, read_calls
from probe.checker.offline import check_dump
from probe.ground.errors import ProbeError


def _tensor(name: str, dtype: str = "torch.float32", shape=(4,)) -> dict:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "data_name": name}


def _write(tmp_path, data: dict, files: dict) -> None:
    folder = tmp_path / "step0" / "rank0"
    (folder / "dump_tensor_data").mkdir(parents=True)
    for name, t in files.items():
        save_file({"tensor": t}, str(folder / "dump_tensor_data" / name))
    (folder / "dump_tensor_data" / "cut.safetensors").write_bytes(b"\x08\x00\x00")
    (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": data}))
    (folder / "construct.json").write_text(json.dumps({k: None for k in data}))


def test_odd_and_hostile_entries_are_skipped_rows_with_a_reason(tmp_path):
    x = torch.randn(4)
    _write(tmp_path, {
        "Torch.exp.0.forward": {"input_args": [_tensor("x.safetensors")], "input_kwargs": {},
                                "output": [_tensor("y.safetensors")]},
        "Torch.exp.1.forward": {"input_args": [_tensor("../../etc/passwd")], "input_kwargs": {},
                                "output": [_tensor("y.safetensors")]},
        "Torch.exp.2.forward": {"input_args": [_tensor("cut.safetensors")], "input_kwargs": {},
                                "output": [_tensor("y.safetensors")]},
        "Torch.exp.3.forward": {"input_args": "not a list", "input_kwargs": [1, 2], "output": 7},
        "Torch.exp.4.forward": {"input_args": [{"type": "torch.dtype", "value": "torch.nonsense"},
                                               {"type": "slice", "value": [1]}, {"no": "type"}],
                                "input_kwargs": {}, "output": [_tensor("y.safetensors")]},
        "Tensor.__add__.x.forward": {"input_args": [], "output": []},
        "Torch.exp.6.forward": {"input_args": [_tensor("x.safetensors")],
                                "input_kwargs": {"type": "int", "value": 3}, "output": [_tensor("y.safetensors")]},
        "Module.net.Linear.forward.0": {"input_args": [], "output": []},
        "Torch.exp.5.backward": {"input": [], "output": []},
        "Mint.add.0.forward": {"input_args": [_tensor("x.safetensors")], "input_kwargs": {},
                               "output": [_tensor("y.safetensors")]},
    }, {"x.safetensors": x, "y.safetensors": torch.exp(x)})
    rows, summary = check_dump(tmp_path)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {f"Torch.exp.{i}.forward" for i in (0, 1, 2, 3, 4, 6)} | {"Mint.add.0.forward"}
    assert by_name["Torch.exp.0.forward"]["verdict"] == "pass"
    assert "no tensor file" in by_name["Torch.exp.1.forward"]["reason"]
    assert "not a readable tensor file" in by_name["Torch.exp.2.forward"]["reason"]
    for name in ("Torch.exp.3.forward", "Torch.exp.4.forward", "Mint.add.0.forward"):
        assert by_name[name]["verdict"] == "skipped" and by_name[name]["reason"], by_name[name]
    assert by_name["Torch.exp.6.forward"]["verdict"] == "pass"        # a kwargs entry that is no dict: none
    assert summary["counts"]["pass"] == 2 and summary["first_failure"] is None


def test_a_dump_folder_without_a_dump_is_one_clear_error(tmp_path):
    with pytest.raises(ProbeError, match="no step\\*/rank\\*/dump.json"):
        find_steps(tmp_path)
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ProbeError, match="give a dump directory"):
        find_steps(tmp_path / "x.txt")
    folder = tmp_path / "step0" / "rank0"
    folder.mkdir(parents=True)
    (folder / "dump.json").write_text("[1, 2]")
    with pytest.raises(ProbeError, match="no 'data' object"):
        read_calls(folder)
