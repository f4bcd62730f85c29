"""compare.load.load_pair: large inputs are read in two processes, with the same records and errors."""

from __future__ import annotations

import pytest

import compare.load as load
from probe.errors import ProbeError
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
