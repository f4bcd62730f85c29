"""compare.csv_native writes the bytes of pyarrow.csv.write_csv (the lists as the compare's text)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pytest

from probe.compare import csv_native


def _arrow(table: pa.Table) -> bytes:
    for i, f in enumerate(table.schema):          # as compare.report._write_csv shows shapes
        if pa.types.is_list(f.type):
            text = pc.binary_join(pc.cast(table.column(i), pa.list_(pa.string())), ", ")
            table = table.set_column(i, f.name, pc.binary_join_element_wise("[", text, "]", ""))
    out = io.BytesIO()
    pcsv.write_csv(table, out)
    return out.getvalue()


def _ours(table: pa.Table, tmp_path, workers: int = 1) -> bytes:
    path = tmp_path / "x.csv"
    if not csv_native.write_csv(table, path, workers):
        pytest.skip("no native CSV formatter here (no C++ compiler)")
    return path.read_bytes()


def test_doubles_as_arrow_formats_them(tmp_path):
    rng = np.random.default_rng(0)
    n = 200_000
    bits = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True).view(np.float64)
    scaled = (rng.random(n) - 0.5) * 10.0 ** rng.integers(-12, 14, n)
    special = np.array([0.0, -0.0, 1e-6, 1e-7, 9.999999999999999e-7, 1e10, 9999999999.999998, 5e-324,
                        1.7976931348623157e308, np.inf, -np.inf, np.nan, 2.0**53, 0.1, 1 / 3, 1e21])
    powers = np.concatenate([2.0 ** np.arange(-1074, 1024), -(10.0 ** np.arange(-320, 308))])
    for values in (bits, scaled, special, powers):
        t = pa.table({"x": pa.array(values, mask=rng.random(len(values)) < 0.05)})
        assert _ours(t, tmp_path) == _arrow(t)


def test_other_columns_slices_and_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_native, "BATCH_ROWS", 3)
    t = pa.table({
        "i": pa.array([1, None, -2**63, 2**63 - 1, 0, 7, 8]),
        "b": pa.array([True, None, False, True, False, None, True]),
        'q"s': pa.array(['a"b""', None, "", 'x\n,"', "é", "plain", '"']),
        "l": pa.array(["q", "w", None, "é", "", "z", "y"], pa.large_string()),
        "shape": pa.array([[4, 64, 256], None, [], [None, 2], [-2**63], [1], [2, 3]], pa.list_(pa.int64())),
        "x": pa.array([1.5, None, -0.0, 1e-7, 123.0, np.nan, 1e10]),
    })
    for table in (t, t.slice(2), t.slice(1, 4), pa.concat_tables([t.slice(0, 2), t.slice(3)])):
        assert _ours(table, tmp_path) == _arrow(table)
        assert _ours(table, tmp_path, workers=2) == _arrow(table)


def test_unknown_types_are_left_to_arrow(tmp_path):
    assert not csv_native.write_csv(pa.table({"d": pa.array([1.0], pa.float32())}), tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()
