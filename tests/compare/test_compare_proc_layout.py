"""probe compare over msprobe 26.2's ``step{N}/proc{PID}`` runs: every step, processes as ranks."""

from __future__ import annotations

import json
from pathlib import Path

from probe.collectors.msprobe_layout import ranked_dump_files
from probe.compare.ranks import compare_runs, rank_pairs
from tests.compare.dumps import chain, write_dump
from tests.conftest import run_probe


def _proc_run(root: Path, pids: list[int], steps: int, faults: dict | None = None) -> Path:
    """A run of ``steps`` steps of processes ``pids`` in msprobe 26.2's layout; ``faults``:
    (step, process index) -> chain() options."""
    for s in range(steps):
        for i, pid in enumerate(pids):
            write_dump(root / f"step{s}" / f"proc{pid}", *chain(4, **(faults or {}).get((s, i), {})))
    return root


def test_proc_folders_are_ranks_in_pid_order_the_same_in_every_step(tmp_path: Path) -> None:
    run = _proc_run(tmp_path / "A", [4242, 977], steps=2)
    keys = {k: str(v.relative_to(run).parent) for k, v in ranked_dump_files(run).items()}
    assert keys == {(0, 0): "step0/proc977", (0, 1): "step0/proc4242",
                    (1, 0): "step1/proc977", (1, 1): "step1/proc4242"}


def test_proc_folders_are_numbered_after_the_rank_folders(tmp_path: Path) -> None:
    for f in ("step0/rank0", "step0/rank1", "step0/proc50", "step0/proc7"):
        write_dump(tmp_path / f, *chain(2))
    keys = {k: v.parent.name for k, v in ranked_dump_files(tmp_path).items()}
    assert keys == {(0, 0): "rank0", (0, 1): "rank1", (0, 2): "proc7", (0, 3): "proc50"}


def test_two_proc_runs_with_other_pids_pair_up_every_step(tmp_path: Path) -> None:
    a = _proc_run(tmp_path / "A", [1001], steps=3)
    b = _proc_run(tmp_path / "B", [2002], steps=3)
    pairs, only_a, only_b = rank_pairs(a, b)
    assert [(p["step"], p["rank"]) for p in pairs] == [(0, 0), (1, 0), (2, 0)]
    assert (only_a, only_b) == ([], [])
    assert all("proc1001" in p["a"] and "proc2002" in p["b"] for p in pairs)


def test_rank_and_plain_rank_layouts_still_pair(tmp_path: Path) -> None:
    for side in "AB":
        for s in range(2):
            write_dump(tmp_path / side / f"step{s}" / "rank0", *chain(2))
        for r in range(2):
            write_dump(tmp_path / f"plain{side}" / f"rank{r}", *chain(2))
    assert [(p["step"], p["rank"]) for p in rank_pairs(tmp_path / "A", tmp_path / "B")[0]] == [(0, 0), (1, 0)]
    assert [(p["step"], p["rank"]) for p in rank_pairs(tmp_path / "plainA", tmp_path / "plainB")[0]] == \
        [(None, 0), (None, 1)]


def test_a_proc_run_is_compared_at_every_step_and_the_diverging_step_is_named(tmp_path: Path) -> None:
    a = _proc_run(tmp_path / "A", [31, 35], steps=2)
    b = _proc_run(tmp_path / "B", [88, 90], steps=2, faults={(1, 1): {"scale": {2: 1.1}}})
    s = compare_runs(a, b, tmp_path / "out", workers=1)
    assert s["compared"] == 4 and s["pairs"] == 4
    first = s["first_divergence"]
    assert (first["step"], first["rank"], first["a"]) == (1, 1, "Module.layers.2.fc.Linear.forward.0")
    for step in range(2):
        for rank in range(2):
            assert (tmp_path / "out" / f"step{step}" / f"rank{rank}" / "compare.csv").exists()


def test_command_compares_every_step_of_proc_runs(tmp_path: Path) -> None:
    a = _proc_run(tmp_path / "A", [500], steps=2)
    b = _proc_run(tmp_path / "B", [600], steps=2, faults={(1, 0): {"scale": {1: 1.1}}})
    p = run_probe("compare", str(a), str(b), "--out", str(tmp_path / "o"), "--workers", "1")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["pairs"] == 2 and summary["first_divergence"]["step"] == 1
