"""Tensor-mode metrics: cosine similarity, max abs/rel error, RMSE, shares within 1e-3 / 1e-4.

Statistics-mode metrics (differences and relative errors of max/min/mean/norm) are SQL in
:mod:`probe.compare.tensor_rows`; this module adds the element-wise metrics when both sides of a row
have a readable tensor file (``.npy``; ``.safetensors`` through safetensors' numpy API, bfloat16
read here; ``.pt`` files as :mod:`probe.compare.pt_reader` reads them, without torch).

>>> import numpy as np
>>> m = tensor_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0015]))
>>> round(m["cosine"], 6), m["one_thousandth"]
(1.0, 1.0)
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["tensor_metrics", "add_tensor_metrics", "load_array"]

log = logging.getLogger(__name__)
_METRICS = ("cosine", "max_abs_err", "max_rel_err", "rmse", "one_thousandth", "one_ten_thousandth")


def tensor_metrics(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Element-wise metrics of two arrays of equal size (flattened, compared in float64)."""
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.size != y.size:
        raise ValueError(f"sizes differ: {x.size} vs {y.size}")
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], y[finite]
    if x.size == 0:
        return {k: float("nan") for k in _METRICS}
    diff = np.abs(x - y)
    denom = np.maximum(np.abs(x), np.finfo(np.float64).tiny)
    rel = diff / denom
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    cos = float(np.dot(x, y) / (nx * ny)) if nx > 0 and ny > 0 else (1.0 if nx == ny else 0.0)
    return {
        "cosine": cos,
        "max_abs_err": float(diff.max()),
        "max_rel_err": float(rel.max()),
        "rmse": float(np.sqrt(np.mean(diff ** 2))),
        "one_thousandth": float(np.mean(rel <= 1e-3)),
        "one_ten_thousandth": float(np.mean(rel <= 1e-4)),
    }


def load_array(path: str) -> np.ndarray | None:
    """Read a dumped tensor file without torch; ``None`` when the format needs torch or the file
    cannot be read (the row keeps its statistics). A bfloat16 tensor, which NumPy has no dtype
    for, is read as the float32 numbers it holds."""
    if not _readable_within_limits(path):
        return None
    try:
        if path.endswith(".npy"):
            return np.load(path, allow_pickle=False)
        if path.endswith(".pt"):                  # msprobe's PyTorch tensor files
            from probe.compare.pt_reader import read_pt

            return read_pt(path)
        if path.endswith(".safetensors"):
            from safetensors.numpy import load_file

            try:
                tensors = load_file(path)
            except TypeError:                 # "data type 'bfloat16' not understood"
                return _bfloat16_safetensors(path)
            return next(iter(tensors.values())) if tensors else None
    except Exception:  # noqa: BLE001 - an unreadable file: keep the statistics
        return None
    return None


def _readable_within_limits(path: str) -> bool:
    """Whether ``path`` is a regular file whose tensor fits the memory limit, its headers checked
    before anything is read (:func:`probe.ground.files.check_tensor_file`: a FIFO, a zip bomb, a
    safetensors header claiming more than the file holds); else one line naming the file is
    logged and its row keeps its statistics."""
    from probe.ground.errors import ProbeError
    from probe.ground.files import check_tensor_file

    if not os.path.lexists(path):
        return False                          # no file: the row keeps its statistics, as always
    try:
        check_tensor_file(path)
    except ProbeError as e:
        log.warning("probe compare: %s", e)
        return False
    return True


#: the largest safetensors header read (the format's own limit is 100 MB)
_MAX_HEADER = 100 * 1024 * 1024


def _bfloat16_safetensors(path: str) -> np.ndarray | None:
    """The one BF16 tensor of a safetensors file as float32 (a bfloat16 is the top half of the
    float32 of the same value), or None when the file holds anything else."""
    import json
    import math

    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= _MAX_HEADER:
            return None
        header = json.loads(f.read(size))
        entries = [v for k, v in header.items() if k != "__metadata__"]
        if len(entries) != 1 or entries[0].get("dtype") != "BF16":
            return None
        shape = [int(d) for d in entries[0]["shape"]]
        start, end = (int(o) for o in entries[0]["data_offsets"])
        if end - start != 2 * math.prod(shape):
            return None
        f.seek(8 + size + start)
        raw = f.read(end - start)
    if len(raw) != end - start:
        return None
    from probe.compare.pt_reader import bfloat16_values

    return bfloat16_values(raw, len(raw) // 2).reshape(shape)


def add_tensor_metrics(rows: pa.Table, progress: bool = False, settled: Any = None) -> pa.Table:
    """Fill the tensor-mode metric columns of ``rows`` where both tensor files are readable;
    ``settled`` (a boolean column, optional): rows whose verdict the statistics settle (not
    compared, or rounding noise: :mod:`probe.compare.verdict`): their metrics are filled, their
    verdicts kept."""
    fa = rows.column("file_a").to_pylist()
    fb = rows.column("file_b").to_pylist()
    todo = [i for i, (x, y) in enumerate(zip(fa, fb)) if x and y]
    if not todo:
        return rows
    cols = {k: rows.column(k).to_pylist() for k in _METRICS}
    it: Any = todo
    if progress:
        from tqdm import tqdm

        it = tqdm(todo, desc="tensors", leave=False)
    for i in it:
        a, b = load_array(fa[i]), load_array(fb[i])
        if a is None or b is None or a.size != b.size:
            continue
        for k, v in tensor_metrics(a, b).items():
            cols[k][i] = v
    for k in _METRICS:
        rows = rows.set_column(rows.schema.get_field_index(k), k, pa.array(cols[k], type=pa.float64()))
    return _regrade(rows, todo, settled)


def _regrade(rows: pa.Table, todo: list[int], settled: Any = None) -> pa.Table:
    """Grade rows with element-wise metrics on them: the largest element error over the
    tensor's magnitude, on the ladder of :mod:`probe.compare.verdict` with the statistics'
    dtype tolerances (the worse of the two gradings). Vectorised over the rows ``todo``; only
    the reasons of the rows it makes worse are formatted one by one."""
    import pyarrow.compute as pc

    from probe.compare.verdict import grade, severity, tolerances

    at = pa.array(todo, type=pa.int64())
    sub = rows.select(["max_abs_err", "cosine", "max_a", "min_a", "max_b", "min_b", "dtype_a", "dtype_b",
                       "err", "verdict"]).take(at)

    def floats(k: str) -> np.ndarray:
        return pc.fill_null(sub.column(k), float("nan")).to_numpy().astype(np.float64)
    mae = floats("max_abs_err")
    graded = ~np.isnan(mae) & ~pc.fill_null(pc.equal(sub.column("verdict"), "unmatched"), False).to_numpy()
    if settled is not None:
        graded &= ~pc.fill_null(settled.take(at), False).to_numpy(zero_copy_only=False)
    stats = np.stack([floats(k) for k in ("max_a", "min_a", "max_b", "min_b")])
    mag = np.where(np.isfinite(stats), np.abs(stats), 0.0).max(axis=0, initial=0.0)
    err = mae / np.maximum(mag, 1e-30)
    (pass_a, warn_a), (pass_b, warn_b) = tolerances(sub.column("dtype_a")), tolerances(sub.column("dtype_b"))
    verdict = grade(err, np.maximum(pass_a, pass_b), np.maximum(warn_a, warn_b))
    worse = graded & (severity(verdict) > severity(sub.column("verdict")))
    new_err = np.maximum(pc.fill_null(sub.column("err"), 0.0).to_numpy(), err)
    cosine = floats("cosine")
    reason = [f"elements differ: max abs error {mae[k]:.2e} = {err[k]:.2e} of the tensor's magnitude "
              f"(cosine {cosine[k]:.6f})" for k in np.flatnonzero(worse)]
    rows_at = np.asarray(todo, dtype=np.int64)

    def put(k: str, typ: pa.DataType, which: np.ndarray, values: Any) -> pa.Table:
        """``rows`` with column ``k`` replaced at the rows ``todo[which]`` by ``values``."""
        mask = np.zeros(rows.num_rows, dtype=bool)
        mask[rows_at[which]] = True
        col = rows.column(k).combine_chunks().cast(typ)
        return rows.set_column(rows.schema.get_field_index(k), k,
                               pc.replace_with_mask(col, pa.array(mask), pa.array(values, type=typ)))
    rows = put("err", pa.float64(), graded, new_err[graded])
    rows = put("verdict", pa.string(), worse, verdict[worse])
    return put("reason", pa.string(), worse, reason)
