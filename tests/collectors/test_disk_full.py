"""A full disk (ENOSPC, EDQUOT) while dumping or writing a store is one line naming the folder
(exit 2), and leaves nothing half-written: no temporary file, no partial segment, no zero-byte
tensor file of the lost step; what was written before stays whole and readable."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid

import pyarrow as pa
import pytest

from probe.collectors import msprobe_writer
from probe.collectors.store import StoreWriter, find_segments
from probe.collectors.records import table_from_rows
from probe.ground.errors import ProbeError


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KB tmpfs (this test runs as root), else a skip."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _metric_rows(n: int, step: int) -> pa.Table:
    return table_from_rows("metric", [{"time": 0, "job": "j", "rank": 0, "step": step,
                                       "name": uuid.uuid4().hex * 4, "value": float(i)} for i in range(n)])


def test_a_store_on_a_full_disk_says_so_in_one_line_and_keeps_earlier_steps(small_disk):
    store = StoreWriter(small_disk / "run", fsync="never")
    written = 0
    with pytest.raises(ProbeError, match="no space left on device") as caught:
        for step in range(10_000):
            store.write("metric", _metric_rows(200, step))
            store.end_step(step)
            written = step + 1
    assert str(small_disk / "run" / "store") in str(caught.value)
    assert written > 0
    left = [f for _, _, files in os.walk(small_disk) for f in files if f.startswith(".tmp-")]
    assert left == []
    import pyarrow.parquet as pq
    segments = find_segments(small_disk / "run")["metric"]
    assert len(segments) == written and sum(pq.read_table(s).num_rows for s in segments) == 200 * written


def test_a_json_file_that_does_not_fit_leaves_no_temporary_file(small_disk):
    folder = small_disk / "step0" / "rank0"
    folder.mkdir(parents=True)
    msprobe_writer.write_files(folder, [("construct.json", b"{}")])
    with pytest.raises(ProbeError, match=f"{folder}: no space left on device"):
        msprobe_writer.write_files(folder, [("dump.json", b"x" * (1 << 20))])
    assert sorted(os.listdir(folder)) == ["construct.json"]


def test_a_quota_error_from_any_writer_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    from probe.cli import main
    from probe.collectors import store as store_module

    def full(*a, **k):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    monkeypatch.setattr(store_module.pq, "write_table", full)
    s = StoreWriter(tmp_path / "run", fsync="never")
    s.write("metric", _metric_rows(3, 0))
    with pytest.raises(ProbeError, match="disk quota exceeded"):
        s.end_step(0)
    assert not [f for _, _, files in os.walk(tmp_path) for f in files]
    # a writer that raises the bare OSError: the command line still says it in one line, exit 2
    monkeypatch.setattr("probe.commands.query.command.callback", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out.csv"))))
    assert main(["query", str(tmp_path), "select 1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "out.csv") in err[0] and "no space left" in err[0]


def test_the_dump_writer_removes_a_step_whose_tensor_files_do_not_fit(tmp_path):
    from probe.dumper.writer import DumpWriter

    written = []

    class Stats:
        def save(self, tensors, path):
            if len(written) == 2:
                open(path, "wb").close()           # what a full disk leaves: an empty file
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            with open(path, "wb") as f:
                f.write(b"data")
            written.append(path)

    class Adapter:
        stats = Stats()

    w = DumpWriter.__new__(DumpWriter)
    w.adapter = Adapter()
    w.report_error = lambda where, e: (_ for _ in ()).throw(AssertionError(where))
    folder = tmp_path / "step3" / "rank0" / "dump_tensor_data"
    folder.mkdir(parents=True)
    files = [(str(folder / f"t{i}.safetensors"), None) for i in range(4)]
    with pytest.raises(ProbeError, match=f"{folder}: no space left on device"):
        w._write_files(3, files)
    assert os.listdir(folder) == []
