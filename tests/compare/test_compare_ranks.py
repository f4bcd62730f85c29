"""probe compare over runs of several ranks: pair by pair on local processes or a Dask cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probe.compare.api import compare
from probe.compare.ranks import compare_runs, rank_pairs
from tests.compare.dumps import chain, write_dump
from tests.conftest import run_probe


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """Two runs of 4 ranks (step0); B's rank 2 diverges at layer 1, rank 3 at layer 3, rank 1
    gets a NaN at layer 4; A has a rank 4 that B lacks."""
    faults = {1: {"nan_at": 4}, 2: {"scale": {1: 1.1}}, 3: {"scale": {3: 1.1}}}
    for r in range(4):
        write_dump(tmp_path / "A" / "step0" / f"rank{r}", *chain(5))
        write_dump(tmp_path / "B" / "step0" / f"rank{r}", *chain(5, **faults.get(r, {})))
    write_dump(tmp_path / "A" / "step0" / "rank4", *chain(5))
    return tmp_path / "A", tmp_path / "B"


def _same_pair_results(x: Path, y: Path) -> bool:
    sx, sy = (json.loads((p / "summary.json").read_text()) for p in (x, y))
    for s in (sx, sy):
        s.pop("elapsed_s")
        s.pop("result_id")          # each compare's own (its files carry it)
    return sx == sy and (x / "compare.csv").read_bytes() == (y / "compare.csv").read_bytes()


def test_rank_pairs_are_keyed_by_step_and_rank_and_a_single_dump_is_no_run(runs, tmp_path):
    pairs, only_a, only_b = rank_pairs(*runs)
    assert [(p["step"], p["rank"]) for p in pairs] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert only_a == [(0, 4)] and only_b == []
    one = runs[0] / "step0" / "rank0"
    assert rank_pairs(one, runs[1] / "step0" / "rank0") == ([], [], [])


def test_runs_compare_every_pair_as_alone_and_name_the_rank_that_diverges_first(runs, tmp_path):
    seen = []
    s = compare_runs(*runs, tmp_path / "out", workers=2, report=seen.append)
    assert sorted(p["rank"] for p in seen) == [0, 1, 2, 3] and s["compared"] == 4
    assert s["only_a"] == ["step 0 rank 4"]
    first = s["first_divergence"]
    assert (first["rank"], first["direction"], first["a"]) == (2, "forward", "Module.layers.1.fc.Linear.forward.0")
    assert first["ranks"] == 3                       # ranks 1, 2, 3 diverge; rank 0 does not
    assert s["first_nan"]["rank"] == 1
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["first_divergence"]["rank"] == 2
    for r in range(4):          # each pair's files are those of a compare of that pair alone
        alone = tmp_path / f"alone{r}"
        compare(str(runs[0] / "step0" / f"rank{r}"), str(runs[1] / "step0" / f"rank{r}"), out=alone)
        assert _same_pair_results(tmp_path / "out" / "step0" / f"rank{r}", alone)


def test_command_prints_each_pair_and_fails_on_the_worst_rank(runs, tmp_path):
    p = run_probe("compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "o"), "--fail-on", "error")
    assert p.returncode == 1, p.stderr
    assert sum(line.startswith("step 0 rank ") for line in p.stdout.splitlines()) == 4
    assert "first divergence: step 0 rank 2 (forward)" in p.stdout


def test_a_pair_that_cannot_be_compared_is_one_line_after_the_others(runs, tmp_path):
    bad = runs[1] / "step0" / "rank3" / "dump.json"
    bad.write_text('{"task": "statistics", "data": {"Module.x.Linear.forward.0": {')
    p = run_probe("compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "o"))
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "1 of 4 pairs" in lines[0] and str(bad) in lines[0] and "truncated" in lines[0]
    assert (tmp_path / "o" / "step0" / "rank2" / "compare.csv").exists()


@pytest.mark.slow
def test_dask_cluster_gives_the_local_results(runs, tmp_path):
    distributed = pytest.importorskip("distributed")
    local = tmp_path / "local"
    compare_runs(*runs, local, workers=1)
    # two single-threaded workers on the loopback interface, stopped with the test
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, memory_limit="2GiB") as cluster:
        p = run_probe("compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "dask"),
                      "--cluster", cluster.scheduler_address, timeout=240)
    assert p.returncode == 0, p.stderr
    for r in range(4):
        assert _same_pair_results(local / "step0" / f"rank{r}", tmp_path / "dask" / "step0" / f"rank{r}")

    def strip(s: dict) -> dict:
        s = {k: v for k, v in s.items() if k not in ("elapsed_s", "workers")}
        s["ranks"] = [{k: v for k, v in x.items() if k not in ("elapsed_s", "out")} for x in s["ranks"]]
        return s
    assert strip(json.loads((local / "summary.json").read_text())) == \
        strip(json.loads((tmp_path / "dask" / "summary.json").read_text()))


def test_cluster_address_with_no_scheduler_is_one_line(runs, tmp_path):
    pytest.importorskip("distributed")
    p = run_probe("compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "o"),
                  "--cluster", "tcp://127.0.0.1:9", timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "no Dask scheduler" in lines[0], p.stderr


def test_runs_compare_never_imports_torch(runs, tmp_path):
    import subprocess
    import sys

    code = ("import sys; from probe.cli import main; rc = main(['compare', sys.argv[1], sys.argv[2], '--out', "
            "sys.argv[3], '--workers', '1']); assert 'torch' not in sys.modules, 'torch imported'; "
            "raise SystemExit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(runs[0]), str(runs[1]), str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
