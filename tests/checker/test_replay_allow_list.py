"""A crafted dump.json cannot make ``probe check-api`` write a file, unpickle one or reach a
process: only pure tensor operations on the allow-list are replayed, the rest are skipped rows
that say why."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from probe.checker.apis import OPS, PURE_EXTRA, refusal
from tests.checker.conftest import probe_here


def _tensor(name: str) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "data_name": name}


def _text(value: str) -> dict:
    return {"type": "str", "value": value}


def test_a_crafted_dump_asking_for_save_load_pickle_or_hub_writes_nothing(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    planted = tmp_path / "planted.pt"
    folder = tmp_path / "dump" / "step0" / "rank0"
    (folder / "dump_tensor_data").mkdir(parents=True)
    x = torch.randn(4)
    save_file({"tensor": x}, str(folder / "dump_tensor_data" / "x.safetensors"))
    save_file({"tensor": torch.exp(x)}, str(folder / "dump_tensor_data" / "y.safetensors"))
    torch.save(x, planted)
    out = [_tensor("y.safetensors")]
    data = {
        "Torch.save.0.forward": {"input_args": [_tensor("x.safetensors"), _text(str(victim))], "output": out},
        "Torch.save.1.forward": {"input_args": [_tensor("x.safetensors"), _text(str(tmp_path / "new.pt"))],
                                 "output": out},
        "Torch.load.0.forward": {"input_args": [_text(str(planted))], "input_kwargs": {}, "output": out},
        "Tensor.__reduce_ex__.0.forward": {"input_args": [_tensor("x.safetensors"), {"type": "int", "value": 2}],
                                           "output": out},
        "Torch.hub.load.0.forward": {"input_args": [_text("owner/repo"), _text("model")], "output": out},
        "Functional.frobnicate.0.forward": {"input_args": [_tensor("x.safetensors")], "output": out},
        "Torch.exp.0.forward": {"input_args": [_tensor("x.safetensors")], "input_kwargs": {}, "output": out},
    }
    (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": data}))
    (folder / "construct.json").write_text(json.dumps({k: None for k in data}))
    before = sorted(p for p in tmp_path.rglob("*"))

    ran = probe_here("check-api", str(tmp_path / "dump"), "--out", str(tmp_path / "check"))

    assert ran.returncode == 0, ran.stderr
    assert victim.read_text() == "precious" and not (tmp_path / "new.pt").exists()
    after = sorted(p for p in tmp_path.rglob("*") if "check" not in p.relative_to(tmp_path).parts)
    assert after == before
    summary = json.loads((tmp_path / "check" / "summary.json").read_text())
    assert summary["counts"]["pass"] == 1 and summary["counts"]["skipped"] == 6
    import pyarrow.parquet as pq
    rows = {r["name"]: r for r in pq.read_table(tmp_path / "check" / "check_api.parquet").to_pylist()}
    for name in data:
        if name != "Torch.exp.0.forward":
            assert rows[name]["verdict"] == "skipped", rows[name]
            assert rows[name]["reason"].startswith(("not replayed:", "not replayable:")), rows[name]
    for name in ("Torch.save.0.forward", "Torch.load.0.forward", "Tensor.__reduce_ex__.0.forward"):
        assert "not a pure tensor operation" in rows[name]["reason"]


def test_the_allow_list_holds_the_op_table_and_nothing_that_touches_files():
    assert all(refusal(f"Functional.{name}") is None for name in [*OPS, *PURE_EXTRA])
    for api in ("Torch.save", "Torch.load", "Torch.from_file", "Aten.from_file", "Tensor.numpy", "Tensor.tolist",
                "Tensor.__reduce_ex__", "Tensor.__setstate__", "Tensor.storage", "Tensor.share_memory_",
                "Torch.hub.load", "Torch.jit.load", "Tensor.pin_memory", "Functional.frobnicate"):
        assert refusal(api) is not None, api
