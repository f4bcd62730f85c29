"""compare.load.load_pair: large inputs are read in two processes, with the same records and errors."""

from __future__ import annotations

import pytest

import probe.compare.load as load
from probe.ground.errors import ProbeError
from tests.compare.dumps import chain, write_dump


@pytest.fixture
def always_parallel(monkeypatch):
    monkeypatch.setattr(load, "PARALLEL_BYTES", 0)


def test_pair_read_in_two_processes_equals_two_plain_reads(always_parallel, tmp_path):
    data, c = chain(6, scale={3: 1.5})
    a, b = write_dump(tmp_path / "a", data, c), write_dump(tmp_path / "b", chain(6)[0], c)
    da, db = load.load_pair(a, b)
    assert da.tensors.equals(load.load_dump(a).tensors) and da.nodes.equals(load.load_dump(a).nodes)
    assert db.tensors.equals(load.load_dump(b).tensors) and db.nodes.equals(load.load_dump(b).nodes)


def test_pair_read_in_two_processes_raises_b_one_line_error(always_parallel, tmp_path):
    data, c = chain(2)
    a = write_dump(tmp_path / "a", data, c)
    b = tmp_path / "b" / "dump.json"
    b.parent.mkdir()
    b.write_text('{"task": "statistics", "data": {"Module.x.Linear.forward.0": {')
    with pytest.raises(ProbeError, match="truncated JSON"):
        load.load_pair(a, b)


def test_a_child_stopped_early_is_reaped_and_leaves_no_files(always_parallel, tmp_path, monkeypatch):
    import glob
    import os
    import time

    data, c = chain(400)
    b = write_dump(tmp_path / "b", data, c)
    slow = load._load_to_file

    def stalled(path):          # the child has written its IPC files and is still busy
        d = slow(path)
        time.sleep(30)
        return d
    monkeypatch.setattr(load, "_load_to_file", stalled)
    pending = load.PendingDump(b, fork=True)
    pid = pending._pid
    deadline = time.time() + 20
    while not glob.glob(f"/dev/shm/{load._IPC_PREFIX}{pid}-*") and time.time() < deadline:
        time.sleep(0.05)
    assert glob.glob(f"/dev/shm/{load._IPC_PREFIX}{pid}-*"), "the child wrote no IPC files"
    pending.close()                                   # A failed: B's read is abandoned
    assert not glob.glob(f"/dev/shm/{load._IPC_PREFIX}{pid}-*")
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)                   # reaped, not a zombie
    pending.close()                                   # twice is fine


def test_a_child_that_dies_is_replaced_by_a_read_here(always_parallel, tmp_path, monkeypatch):
    data, c = chain(4)
    b = write_dump(tmp_path / "b", data, c)
    monkeypatch.setattr(load, "_load_to_file", lambda path: (_ for _ in ()).throw(MemoryError()))
    d = load.PendingDump(b, fork=True).result()
    assert d.tensors.equals(load.load_dump(b).tensors)


@pytest.mark.parametrize("pair", ["chain", "fixtures"])
def test_b_normalised_in_the_worker_gives_the_one_core_result(always_parallel, tmp_path, monkeypatch, pair):
    """B read and normalised in the worker process (compare_paths' parallel path) gives the
    result of the compare done on one core, file for file."""
    import filecmp
    import json
    from pathlib import Path

    import probe.compare.pipeline as pipeline
    from probe.compare.api import compare

    if pair == "chain":
        data, c = chain(12, scale={5: 1.5}, nan_at=9)
        a, b = write_dump(tmp_path / "a", data, c), write_dump(tmp_path / "b", chain(12)[0], c)
    else:
        fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe"
        a, b = fixtures / "mindspore_mix", fixtures / "mindspore_L0"
    prepared = []
    real = pipeline._Prepared.__init__
    monkeypatch.setattr(pipeline._Prepared, "__init__",
                        lambda self, *args: prepared.append(1) or real(self, *args))
    forked = compare(str(a), str(b), out=tmp_path / "forked")
    assert prepared, "B was not normalised in the worker"
    serial = compare(str(a), str(b), out=tmp_path / "serial", parallel=False)
    assert forked.rows.num_rows == serial.rows.num_rows and forked.nodes.equals(serial.nodes)
    assert filecmp.cmp(tmp_path / "forked" / "compare.csv", tmp_path / "serial" / "compare.csv", shallow=False)
    import pyarrow as pa
    import pyarrow.parquet as pq

    def content(path: Path) -> bytes:        # the table's bytes, less the compare's own id
        table = pq.read_table(path).replace_schema_metadata(None)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        return sink.getvalue().to_pybytes()
    for name in ("compare.parquet", "nodes.parquet"):
        assert content(tmp_path / "forked" / name) == content(tmp_path / "serial" / name), name
    strip = [{k: v for k, v in json.loads((tmp_path / d / "summary.json").read_text()).items()
              if k not in ("elapsed_s", "result_id")} for d in ("forked", "serial")]
    assert strip[0] == strip[1]
