"""The dump's rows: each value's JSON entry and tensor record, named by the one schema."""

from __future__ import annotations

import pytest
import torch

from probe.collectors.records import TENSOR
from probe.engine_adapter.torch_stats import TorchStats
from probe.dumper.rows import ROW_COLUMNS, STAT_COLUMNS, RowBuilder, TensorTables, apply_statistics


def test_rows_and_statistics_land_in_the_tensor_record_columns_they_are_named_for():
    rows = RowBuilder(TorchStats(), want_hash=True, save=None)
    t = torch.tensor([[1.0, -3.0], [2.0, 4.0]], requires_grad=True)
    entry = rows.value(t, 7, "Module.a.Linear.forward.0", "module", "forward", "input", "0")
    scalar = rows.value(2.5, 7, "Module.a.Linear.forward.0", "module", "forward", "kwarg", "alpha")
    assert scalar == {"type": "float", "value": 2.5}
    tensor_row, scalar_row = (dict(zip(ROW_COLUMNS, r)) for r in rows.rows)
    assert tensor_row == {"seq": 7, "node": "Module.a.Linear.forward.0", "node_kind": "module",
                          "direction": "forward", "slot": "input", "index": "0",
                          "dtype": "torch.float32", "shape": [2, 2], "numel": 4,
                          "hash": entry["md5"], "tensor_file": None, "requires_grad": True,
                          "value": None, "tensor_id": None}
    assert (scalar_row["slot"], scalar_row["index"], scalar_row["dtype"], scalar_row["value"]) == (
        "kwarg", "alpha", "float", "2.5")

    stats = apply_statistics(rows.leaves, rows.stats.gather(rows.handles), len(rows.rows))
    assert set(stats) == set(STAT_COLUMNS)
    assert [stats[c].to_pylist()[0] for c in STAT_COLUMNS] == [4.0, -3.0, 1.0, pytest.approx(30 ** 0.5), 0, 0]
    assert all(stats[c].to_pylist()[1] is None for c in STAT_COLUMNS)
    assert (entry["Max"], entry["Min"], entry["Mean"]) == (4.0, -3.0, 1.0)

    table = TensorTables("run", 3).table(5, 123, rows.rows, stats)
    assert table.schema.equals(TENSOR)
    first = table.to_pylist()[0]
    assert {k: first[k] for k in ("run", "rank", "step", "host_ts_ns", "seq", "max", "l2norm")} == {
        "run": "run", "rank": 3, "step": 5, "host_ts_ns": 123, "seq": 7, "max": 4.0,
        "l2norm": pytest.approx(30 ** 0.5)}
