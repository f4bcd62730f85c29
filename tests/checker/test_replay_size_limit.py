"""An allow-listed op whose arguments ask for a huge tensor (a crafted dump's
``torch.zeros(10**12)``, ``one_hot`` with a billion classes, ``repeat`` by a million) is not
replayed by ``probe check-api``: refused before anything is allocated, bounded by the tensor
byte limit (``PROBE_MAX_TENSOR_BYTES``), and listed as skipped with the reason."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

from probe.checker.apis import OPS, PURE_EXTRA, requested_elements
from tests.checker.conftest import probe_here

pytestmark = pytest.mark.timeout(120)


def _tensor(name: str, shape: list[int], dtype: str = "torch.float32") -> dict:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": shape, "data_name": name}


def _int(v: int) -> dict:
    return {"type": "int", "value": v}


def _crafted(tmp_path, size: int):
    folder = tmp_path / "dump" / "step0" / "rank0"
    (folder / "dump_tensor_data").mkdir(parents=True)
    files = folder / "dump_tensor_data"
    save_file({"tensor": torch.zeros(4)}, str(files / "z.safetensors"))
    save_file({"tensor": torch.ones(2, 3)}, str(files / "x.safetensors"))
    save_file({"tensor": torch.zeros(3, dtype=torch.long)}, str(files / "i.safetensors"))
    small = [_tensor("z.safetensors", [4])]
    data = {
        "Torch.zeros.0.forward": {"input_args": [_int(size)], "input_kwargs": {}, "output": small},
        "Torch.zeros.1.forward": {"input_args": [_int(4)], "input_kwargs": {}, "output": small},
        "Tensor.new_zeros.0.forward": {"input_args": [_tensor("x.safetensors", [2, 3]),
                                                      {"type": "torch.Size", "value": [size, 2]}],
                                       "input_kwargs": {}, "output": small},
        "Functional.one_hot.0.forward": {"input_args": [_tensor("i.safetensors", [3], "torch.int64"), _int(size)],
                                         "input_kwargs": {}, "output": small},
        "Tensor.repeat.0.forward": {"input_args": [_tensor("x.safetensors", [2, 3]), _int(size), _int(1)],
                                    "input_kwargs": {}, "output": small},
        "Torch.arange.0.forward": {"input_args": [_int(size)], "input_kwargs": {}, "output": small},
    }
    (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": data}))
    (folder / "construct.json").write_text(json.dumps({k: None for k in data}))
    return tmp_path / "dump", data


def _rows(out) -> dict:
    return {r["name"]: r for r in pq.read_table(out / "check_api.parquet").to_pylist()}


def test_a_size_over_the_limit_is_refused_before_the_replay(tmp_path, monkeypatch):
    """10**6 elements under a 1 MB limit: each sized call is skipped with the reason (without
    the check it was replayed), the same op at a small size is replayed."""
    monkeypatch.setenv("PROBE_MAX_TENSOR_BYTES", str(1 << 20))
    dump, data = _crafted(tmp_path, 10**6)
    ran = probe_here("check-api", str(dump), "--out", str(tmp_path / "check"))
    assert ran.returncode == 0, ran.stderr
    rows = _rows(tmp_path / "check")
    for name in data:
        if name == "Torch.zeros.1.forward":
            assert rows[name]["verdict"] == "pass", rows[name]
            continue
        assert rows[name]["verdict"] == "skipped", rows[name]
        assert "arguments ask for a tensor of" in rows[name]["reason"], rows[name]
        assert "PROBE_MAX_TENSOR_BYTES" in rows[name]["reason"], rows[name]


def test_a_crafted_zeros_of_10_to_the_12_allocates_nothing(tmp_path):
    """Through a real process, at the default limit: done in seconds, its memory never near the
    4 TB asked for."""
    dump, _ = _crafted(tmp_path, 10**12)
    p = subprocess.run([sys.executable, "-c", "import sys, resource; from probe.cli import main; rc = main(sys.argv[1:]); "
                        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)",
                        "check-api", str(dump), "--out", str(tmp_path / "check")],
                       capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.strip().splitlines()[-1]) < 2 << 20          # KB: under 2 GB
    rows = _rows(tmp_path / "check")
    assert "arguments ask for a tensor of 1000000000000 elements" in rows["Torch.zeros.0.forward"]["reason"]


def test_every_sized_op_is_on_the_allow_list_or_refused_anyway():
    from probe.checker.apis import _SIZED, refusal

    for base in _SIZED:
        assert base in OPS or base in PURE_EXTRA or refusal(f"Torch.{base}") is not None or base in (
            "empty", "empty_strided", "new_empty", "new_empty_strided", "range"), base
    assert requested_elements("Torch.zeros", [10**6, 10**6], {}) == 10**12
    assert requested_elements("Torch.exp", [torch.ones(3)], {}) is None
