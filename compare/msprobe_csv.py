"""compare_msprobe.csv (and, on request, an .xlsx): the compare's tensor rows under msprobe's names.

msprobe's statistics compare writes one row per tensor pair under the header
``CompareConst.SUMMARY_COMPARE_RESULT_HEADER`` of mindstudio-probe 26.2
(``msprobe/core/common/const.py``): :data:`HEADER`, in that order. A user's scripts that read
msprobe's CSV read this one. compare.csv keeps our own columns; this file is a projection of
the same rows (the same order), each column mapped from ours:

- ``NPU`` is side A, ``Bench`` side B; a name without a counterpart is ``N/A``;
- dtypes are our normalised names (``float32``, where msprobe repeats the dump's spelling);
  shapes are ``[2, 4]`` as in compare.csv;
- ``Max diff`` ... ``L2norm diff``: A − B, as msprobe subtracts (compare.csv's ``*_diff`` are
  B − A); ``MaxRelativeErr`` ...: ``|A − B| / |B|`` in percent as msprobe writes it
  (``12.5%``, the number as Arrow writes it: ``50%`` where pandas writes ``50.0%``; ``0`` when
  equal, ``N/A`` when B is 0, ``nan`` when either is NaN);
- ``NPU Requires_grad``, ``Bench Requires_grad``, ``Requires_grad Consistent``: ``N/A`` (the
  compare rows do not carry requires_grad);
- ``Result``: our tensor verdict (``pass``, ``warning``, ``error``, ``nan``; ``N/A``
  unmatched), graded on our tolerance (:mod:`probe.compare.verdict`), not msprobe's (whose
  statistics mode grades nothing and flags a relative difference over 50 % as ``warning``);
  ``Err_message``: our reason (``No bench data matched.`` for a tensor without B).

msprobe 26.2's statistics header has no ``Accuracy Reached or Not`` column (its constant
``ACCURACY`` is in no header), so neither has this file.

>>> import pyarrow as pa
>>> t = msprobe_table(pa.table({"name_a": ["x.output.0"], "name_b": ["x.output.0"],
...     "dtype_a": ["float32"], "dtype_b": ["float32"], "shape_a": [[2]], "shape_b": [[2]],
...     "max_a": [1.5], "min_a": [0.0], "mean_a": [1.0], "norm_a": [2.0],
...     "max_b": [1.0], "min_b": [0.0], "mean_b": [1.0], "norm_b": [0.0],
...     "verdict": ["error"], "reason": ["max differs"]}))
>>> row = t.to_pylist()[0]
>>> row["Max diff"], row["MaxRelativeErr"], row["MinRelativeErr"], row["NormRelativeErr"], row["Result"]
(0.5, '50%', '0', 'N/A', 'error')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from probe.ground.errors import ProbeError

__all__ = ["HEADER", "msprobe_table", "write_msprobe_csv", "write_xlsx"]

#: msprobe 26.2's statistics compare header, in its order.
HEADER = ("NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
          "Bench Tensor Shape", "NPU Requires_grad", "Bench Requires_grad",
          "Max diff", "Min diff", "Mean diff", "L2norm diff",
          "MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr",
          "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean",
          "Bench l2norm", "Requires_grad Consistent", "Result", "Err_message")

_STATS = (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "L2norm"))
_REL = {"max": "MaxRelativeErr", "min": "MinRelativeErr", "mean": "MeanRelativeErr",
        "norm": "NormRelativeErr"}
_NPU_STAT = {"max": "NPU max", "min": "NPU min", "mean": "NPU mean", "norm": "NPU l2norm"}
_BENCH_STAT = {"max": "Bench max", "min": "Bench min", "mean": "Bench mean", "norm": "Bench l2norm"}


def _relative(a: Any, b: Any) -> Any:
    """msprobe's relative error text of statistics ``a`` (NPU) and ``b`` (Bench)."""
    import pyarrow.compute as pc

    pct = pc.abs(pc.multiply(pc.divide(pc.subtract(a, b), b), 100.0))
    text = pc.binary_join_element_wise(pc.cast(pct, pa.string()), "%", "")
    nan = pc.or_(pc.is_nan(a), pc.is_nan(b))
    return pc.case_when(pc.make_struct(pc.fill_null(nan, False), pc.fill_null(pc.equal(a, b), False),
                                       pc.fill_null(pc.equal(b, 0.0), False),
                                       pc.or_(pc.is_null(a), pc.is_null(b))),
                        "nan", "0", "N/A", "N/A", text)


def _shape_text(col: Any) -> Any:
    import pyarrow.compute as pc

    text = pc.binary_join(pc.cast(col, pa.list_(pa.string())), ", ")
    return pc.fill_null(pc.binary_join_element_wise("[", text, "]", ""), "N/A")


def msprobe_table(rows: pa.Table) -> pa.Table:
    """The compare's tensor ``rows`` (compare.csv's columns) as msprobe's statistics compare
    CSV columns (:data:`HEADER`, mapped as the module docstring says)."""
    import pyarrow.compute as pc

    n = rows.num_rows
    na = pa.array(["N/A"] * n, type=pa.string()) if n else pa.array([], type=pa.string())
    cols: dict[str, Any] = {
        "NPU Name": pc.fill_null(rows.column("name_a"), "N/A"),
        "Bench Name": pc.fill_null(rows.column("name_b"), "N/A"),
        "NPU Dtype": pc.fill_null(rows.column("dtype_a"), "N/A"),
        "Bench Dtype": pc.fill_null(rows.column("dtype_b"), "N/A"),
        "NPU Tensor Shape": _shape_text(rows.column("shape_a")),
        "Bench Tensor Shape": _shape_text(rows.column("shape_b")),
        "NPU Requires_grad": na, "Bench Requires_grad": na,
    }
    for stat, label in _STATS:
        a, b = rows.column(f"{stat}_a"), rows.column(f"{stat}_b")
        cols[f"{label} diff"] = pc.subtract(a, b)
        cols[_REL[stat]] = _relative(a, b)
        cols[_NPU_STAT[stat]] = a
        cols[_BENCH_STAT[stat]] = b
    no_bench = pc.is_null(rows.column("name_b"))
    cols["Requires_grad Consistent"] = na
    cols["Result"] = pc.if_else(pc.equal(rows.column("verdict"), "unmatched"), "N/A", rows.column("verdict"))
    cols["Err_message"] = pc.if_else(no_bench, "No bench data matched.",
                                     pc.fill_null(rows.column("reason"), ""))
    return pa.table({h: cols[h] for h in HEADER})


#: Rows projected and written at a time: the projection of a 266k-row compare whole raised the
#: compare's peak memory by 80 MB (100k entries); a slice's is a few MB.
SLICE_ROWS = 16_384


def write_msprobe_csv(rows: pa.Table, path: Path) -> None:
    """compare_msprobe.csv of the compare's tensor ``rows``, formatted as compare.csv is (the
    native formatter, else Arrow's writer), a slice of :data:`SLICE_ROWS` at a time."""
    import pyarrow.csv as pcsv

    from probe.compare.csv_native import write_csv

    slices = (msprobe_table(rows.slice(start, SLICE_ROWS))
              for start in range(0, max(rows.num_rows, 1), SLICE_ROWS))
    first = next(slices)
    if write_csv(first, path):
        for table in slices:
            write_csv(table, path, append=True)
        return
    with pcsv.CSVWriter(str(path), first.schema) as writer:   # no native formatter
        writer.write_table(first)
        for table in slices:
            writer.write_table(table)


def write_xlsx(rows: pa.Table, path: Path) -> None:
    """compare.xlsx: msprobe's columns (:func:`msprobe_table`) in one sheet, as msprobe's
    compare offers its result. Needs openpyxl (an optional dependency): a one-line
    :class:`~probe.ground.errors.ProbeError` saying how to install it when it is missing."""
    try:
        from openpyxl import Workbook
    except ImportError:
        raise ProbeError("--xlsx needs openpyxl, which is not installed: pip install openpyxl "
                         "(or pip install 'probe-toolchain[xlsx]')") from None
    table = msprobe_table(rows)
    wb = Workbook(write_only=True)
    ws = wb.create_sheet("compare")
    ws.append(list(table.column_names))
    for batch in table.to_batches(max_chunksize=8192):
        for row in zip(*(c.to_pylist() for c in batch.columns)):
            ws.append([_cell(v) for v in row])
    try:
        wb.save(path)
    except OSError as e:
        raise ProbeError(f"{path}: cannot write the workbook ({e.strerror})") from None


def _cell(v: Any) -> Any:
    """A value a worksheet cell holds: non-finite numbers as text (a cell has no NaN)."""
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v
