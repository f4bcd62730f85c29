"""The monitor's metric series as TensorBoard scalars: ``probe monitor export --tensorboard DIR``.

Every stored point (step metrics such as ``loss`` and ``step_time_ms``, and the per-module
numerics ``numerics:<module>:<quantity>`` of :mod:`probe.monitor.numerics_names`) becomes a scalar in
an event file TensorBoard reads, one run per job and rank::

    DIR/<job>/rank<R>/events.out.tfevents.<time>.probe-monitor

so TensorBoard draws the ranks of a job as lines of one chart. Tags: ``step/<name>`` for a step
metric (``step/loss``, ``step/step_time_ms``) and ``numerics/<module>/<quantity>`` for a
numerics point (``numerics/layers.1.mlp/grad_norm``); each point keeps its step and its time.

The files are written here, with no TensorBoard or TensorFlow installed: an event file is a
TFRecord file (each record: its length, a masked CRC-32C of the length, the bytes, a masked
CRC-32C of the bytes) of ``Event`` protocol buffers (``wall_time`` 1, ``step`` 2,
``file_version`` 3, ``summary`` 5 holding ``Summary.Value`` entries with ``tag`` 1 and
``simple_value`` 2), which are encoded by hand below. One event per rank and step holds all its
scalars.

>>> masked_crc32c(b"123456789") == (((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xA282EAD8) & 0xFFFFFFFF
True
>>> tag_of("numerics:layers.1.mlp:grad_norm"), tag_of("loss")
('numerics/layers.1.mlp/grad_norm', 'step/loss')
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa

from probe.monitor.numerics_names import parse_metric_name

#: Rows asked of the service per page when reading a job's points.
PAGE_ROWS = 500_000


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC TFRecord stores: CRC-32C rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1                     # int64 two's complement, as protobuf does
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


def encode_event(wall_time: float, step: int | None = None,
                 scalars: Iterable[tuple[str, float]] = (), file_version: str = "") -> bytes:
    """One ``Event`` message: its time, step and scalars (``Summary.Value``: tag, simple_value)."""
    out = bytearray(_field(1, 1) + struct.pack("<d", wall_time))
    if step is not None:
        out += _field(2, 0) + _varint(int(step))
    if file_version:
        out += _bytes_field(3, file_version.encode())
    values = b"".join(_bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5)
                                   + struct.pack("<f", value)) for tag, value in scalars)
    if values:
        out += _bytes_field(5, values)
    return bytes(out)


def record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data)))


def tag_of(name: str) -> str:
    """The TensorBoard tag of a metric name (see the module docstring)."""
    parsed = parse_metric_name(name)
    if parsed is not None:
        return f"numerics/{parsed[0]}/{parsed[1]}"
    return f"step/{name}"


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def write_run(folder: str | os.PathLike, rows: pa.Table) -> Path:
    """Write one rank's points (``step``, ``time_ns``, ``name``, ``value``) as an event file in
    ``folder``; returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"events.out.tfevents.{int(time.time())}.{_SAFE.sub('_', socket.gethostname())}"
    rows = rows.sort_by([("step", "ascending"), ("name", "ascending")])
    steps = rows.column("step").to_pylist()
    times = rows.column("time_ns").to_pylist()
    names = rows.column("name").to_pylist()
    values = rows.column("value").to_pylist()
    tags: dict[str, str] = {}
    with open(path, "wb") as f:
        f.write(record(encode_event(time.time(), file_version="brain.Event:2")))
        i, n = 0, len(steps)
        while i < n:
            j = i
            while j < n and steps[j] == steps[i]:
                j += 1
            scalars = []
            for k in range(i, j):
                if values[k] is None:
                    continue
                tag = tags.get(names[k]) or tags.setdefault(names[k], tag_of(names[k]))
                scalars.append((tag, float(values[k])))
            wall = min(t for t in times[i:j] if t is not None) / 1e9 if any(
                t is not None for t in times[i:j]) else time.time()
            if scalars:
                f.write(record(encode_event(wall, steps[i], scalars)))
            i = j
    return path


def export_points(table: pa.Table, out_dir: str | os.PathLike) -> dict[tuple[str, int], dict[str, Any]]:
    """Write ``table`` (metric points: job, rank, step, time_ns, name, value) as one event file
    per job and rank under ``out_dir/<job>/rank<R>/``; returns, per (job, rank), the file, the
    points and the tags written."""
    import pyarrow.compute as pc

    out: dict[tuple[str, int], dict[str, Any]] = {}
    if not table.num_rows:
        return out
    keys = table.group_by(["job", "rank"]).aggregate([]).to_pylist()
    for key in keys:
        job, rank = key["job"], int(key["rank"])
        rows = table.filter(pc.and_(pc.equal(table["job"], job), pc.equal(table["rank"], rank)))
        path = write_run(Path(out_dir) / _SAFE.sub("_", job) / f"rank{rank}", rows)
        out[(job, rank)] = {"file": str(path), "points": rows.num_rows,
                            "tags": len(set(rows.column("name").to_pylist()))}
    return out


def points_from_store(path: str | os.PathLike, job: str | None = None) -> pa.Table:
    """Every metric point of a monitor store file (DuckDB, opened read-only)."""
    import duckdb

    from probe.ground.errors import ProbeError

    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as e:
        raise ProbeError(f"{path}: cannot read the monitor store ({str(e).splitlines()[0]}); "
                         "while a service has it open, export with --addr instead") from None
    try:
        sql = "SELECT job, rank, step, time_ns, name, value FROM metrics"
        return con.sql(sql + (" WHERE job = ?" if job else ""),
                       params=[job] if job else None).to_arrow_table()
    finally:
        con.close()


def points_from_service(client: Any, job: str | None = None, page_rows: int = PAGE_ROWS) -> pa.Table:
    """Every metric point of ``job`` (every job when None) from a running service, page by page
    (a reply has a size limit)."""
    jobs = [job] if job else [j["job"] for j in client.status()["jobs"]]
    parts = []
    for name in jobs:
        since, rows = 0, page_rows
        while True:
            page = client.metrics(job=name, since_step=since, limit=rows)
            if page.num_rows < rows:
                parts.append(page)
                break
            steps = page.column("step").to_pylist()
            last = steps[-1]
            if steps[0] == last:               # one step fills the page: ask for more
                rows *= 2
                continue
            keep = next(i for i in range(len(steps) - 1, -1, -1) if steps[i] != last) + 1
            parts.append(page.slice(0, keep))
            since = last
    parts = [p.select(["job", "rank", "step", "time_ns", "name", "value"]) for p in parts
             if p.num_rows]
    if not parts:
        return pa.table({"job": pa.array([], pa.string()), "rank": pa.array([], pa.int32()),
                         "step": pa.array([], pa.int64()), "time_ns": pa.array([], pa.int64()),
                         "name": pa.array([], pa.string()), "value": pa.array([], pa.float64())})
    return pa.concat_tables(parts)
