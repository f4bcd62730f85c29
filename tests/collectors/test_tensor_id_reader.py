"""``tensor_id``: read back from our dump.json (native scanner and general path alike) and from
the store; null for msprobe's own dumps, older stores and anything that is not an integer."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import probe.collectors.msprobe_scan as scan
from probe.collectors.msprobe_reader import read_msprobe_dump
from probe.collectors.records import TENSOR
from probe.collectors.store import StoreWriter, read_step
from probe.visualizer.graph import Graph


def _t(**extra) -> dict:
    d = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.5,
         "Min": -2.0, "Mean": 0.25, "Norm": 3.0, "requires_grad": True}
    d.update(extra)
    return d


def _write(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L0", "framework": "pytorch",
                                "dump_data_dir": None, "data": data}))
    return path


def _ids(path: Path, monkeypatch: pytest.MonkeyPatch, *, native: bool) -> dict:
    monkeypatch.setattr(scan, "_fn", None if native else False)
    tensors = read_msprobe_dump(path).tensors
    assert tensors.schema.field("tensor_id").type == pa.int64()
    return {(r["node"], r["slot"], r["index"]): r["tensor_id"] for r in tensors.to_pylist()}


def test_our_tensor_ids_round_trip_through_both_readers(tmp_path, monkeypatch):
    path = _write(tmp_path, {
        "Module.a.Linear.forward.0": {"input_args": [_t(tensor_id=0)], "input_kwargs": {},
                                      "output": [_t(tensor_id=1)],
                                      "parameters": {"weight": _t(tensor_id=2), "bias": _t()}},
        "Module.b.ReLU.forward.0": {"input_args": [_t(tensor_id=1)], "output": [_t(tensor_id=None)]},
        "Module.a.Linear.parameters_grad.0": {"weight": [_t(tensor_id=9)]},
    })
    want = {("Module.a.Linear.forward.0", "input", "0"): 0, ("Module.a.Linear.forward.0", "output", "0"): 1,
            ("Module.a.Linear.forward.0", "parameter", "weight"): 2,
            ("Module.a.Linear.forward.0", "parameter", "bias"): None,
            ("Module.b.ReLU.forward.0", "input", "0"): 1, ("Module.b.ReLU.forward.0", "output", "0"): None,
            ("Module.a.Linear.parameters_grad.0", "parameter_grad", "weight"): 9}
    if scan._scanner():
        assert scan.scan_file(path) is not None               # our layout is the scanner's
        assert _ids(path, monkeypatch, native=True) == want
    assert _ids(path, monkeypatch, native=False) == want
    edges = Graph.load(path).flow()
    assert [(e.src, e.dst, e.via) for e in edges] == [
        ("Module.a.Linear.forward.0", "Module.b.ReLU.forward.0", "tensor_id")]


@pytest.mark.parametrize("odd", ["7", True, 2 ** 70, [1], {"x": 1}])
def test_a_tensor_id_that_is_not_an_integer_reads_as_null(tmp_path, monkeypatch, odd):
    path = _write(tmp_path, {"Module.a.Linear.forward.0": {"input_args": [_t(tensor_id=odd)],
                                                           "output": [_t(tensor_id=3)]}})
    for native in (True, False):
        ids = _ids(path, monkeypatch, native=native)
        assert ids[("Module.a.Linear.forward.0", "output", "0")] == 3
        assert ids[("Module.a.Linear.forward.0", "input", "0")] is None


def test_msprobe_dumps_have_no_tensor_id_and_their_edges_come_from_statistics(msprobe_data):
    for name in ("torch_L0", "torch_llama_mix", "mindspore_L0"):
        dump = read_msprobe_dump(msprobe_data / name if (msprobe_data / name / "dump.json").exists()
                                 else next((msprobe_data / name).rglob("dump.json")))
        assert dump.tensors.column("tensor_id").null_count == dump.tensors.num_rows, name
    flow = Graph.load(msprobe_data / "torch_llama_mix").flow()
    assert flow and {e.via for e in flow} == {"statistics"}


def test_a_store_with_older_segments_without_the_column_reads_them_as_null(tmp_path):
    new = pa.Table.from_pylist([{"run": "r", "rank": 0, "step": 0, "seq": 0, "node": "n", "slot": "output",
                                 "index": "0", "tensor_id": 5}], schema=TENSOR)
    with StoreWriter(tmp_path, rank=0, run="r") as w:
        w.write("tensor", new)
    folder = tmp_path / "store" / "tensor" / "rank0"
    old = new.drop_columns(["tensor_id"]).set_column(3, "seq", pa.array([1], pa.int64()))
    pq.write_table(old, folder / "seg-old.parquet")
    tensors, _, _, _ = read_step(tmp_path, 0, 0)
    assert tensors.schema.field("tensor_id").type == pa.int64()
    assert tensors.column("tensor_id").to_pylist() == [5, None]
    # a store written before the column existed at all
    only_old = tmp_path / "old"
    (only_old / "store" / "tensor" / "rank0").mkdir(parents=True)
    pq.write_table(old, only_old / "store" / "tensor" / "rank0" / "seg-old.parquet")
    tensors, _, _, _ = read_step(only_old, 0, 0)
    assert tensors.column("tensor_id").to_pylist() == [None]
