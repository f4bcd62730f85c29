"""A dump.json's data_name is a file name inside its data folder: a path in it is not followed."""

from __future__ import annotations

import json

from probe.collectors.msprobe_reader import read_msprobe_dump


def _entry(data_name: str) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0,
            "Mean": 0.5, "Norm": 1.0, "requires_grad": False, "data_name": data_name}


def test_a_data_name_with_a_path_is_not_followed(tmp_path):
    data = {"Functional.relu.0.forward": {"input_args": [_entry("../../secret.safetensors")],
                                          "input_kwargs": {},
                                          "output": [_entry("Functional.relu.0.forward.output.0.pt")]},
            "Functional.relu.1.forward": {"input_args": [_entry("/etc/hostname")], "input_kwargs": {},
                                          "output": [_entry("..")]}}
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch",
                                "dump_data_dir": str(tmp_path / "dump_tensor_data"), "data": data}))
    files = read_msprobe_dump(path).tensors.column("tensor_file").to_pylist()
    kept = [f for f in files if f]
    assert len(kept) == 1 and kept[0].endswith("dump_tensor_data/Functional.relu.0.forward.output.0.pt")
