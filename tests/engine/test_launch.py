"""The launcher: ranks never outlive it, and the step table names the straggler by its own work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from probe.engine.launch import STRAGGLER_QUERY, rank_table, run_training
from probe.engine.spec import RunSpec
from tests.conftest import ROOT


def _start_long_training(out) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """``probe train`` with 2 ranks and far more steps than the test waits for; returns the
    launcher and its two rank processes once both train."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "probe.cli", "train", "--nproc", "2", "--max-steps", "100000",
         "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline:
        try:
            ranks = [p for p in psutil.Process(launcher.pid).children(recursive=True)
                     if "spawn_main" in " ".join(p.cmdline())]
        except psutil.Error:
            ranks = []
        if len(ranks) == 2 and list(out.glob("store/metric/rank1/*.parquet")):
            return launcher, ranks
        assert launcher.poll() is None, launcher.stderr.read().decode()[-2000:]
        time.sleep(0.2)
    launcher.kill()
    pytest.fail("the 2-rank training did not start in 120 s")


def _gone(procs: list[psutil.Process], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _kill_all(launcher: subprocess.Popen, ranks: list[psutil.Process]) -> None:
    launcher.kill()
    for p in ranks:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.mark.slow
def test_no_rank_survives_a_launcher_killed_with_sigkill(tmp_path):
    launcher, ranks = _start_long_training(tmp_path / "run")
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        assert _gone(ranks, 10), "rank processes kept running after the launcher was killed"
    finally:
        _kill_all(launcher, ranks)


@pytest.mark.slow
def test_sigint_or_sigterm_to_the_launcher_alone_stops_every_rank(tmp_path):
    for sig, name in ((signal.SIGINT, "int"), (signal.SIGTERM, "term")):
        launcher, ranks = _start_long_training(tmp_path / name)
        try:
            os.kill(launcher.pid, sig)            # the launcher alone, not its process group
            code = launcher.wait(20)
            assert code == 130, launcher.stderr.read().decode()[-2000:]
            assert _gone(ranks, 5), f"rank processes kept running after SIG{name.upper()}"
        finally:
            _kill_all(launcher, ranks)


@pytest.mark.slow
def test_the_straggler_is_named_by_its_own_work_not_the_synchronised_step_time(tmp_path):
    """In a synchronous job every rank's step lasts as long as the slowest's: the step table and
    the suggested query must point at the rank whose compute is slow (rank 1 here)."""
    result = run_training(RunSpec(nproc=2, max_steps=8, faults=("slow:1:3",), out_dir=str(tmp_path),
                                  quiet=True, extra_env=(("OMP_NUM_THREADS", "1"),)))
    named = [row["slowest_rank"] for row in result.steps[1:]]
    assert named.count(1) >= len(named) - 1, named
    assert rank_table(str(tmp_path))[0]["rank"] == 1
    from probe.collectors.store import open_store

    assert open_store(tmp_path).sql(STRAGGLER_QUERY).fetchall()[0][0] == 1
    # the planted slowness is more work (a slower processor), so it shows on the CPU clock too:
    # rank 1's compute CPU time about 3x rank 0's, where a neighbour would stretch the wall only
    ratio = open_store(tmp_path).sql(
        "SELECT median(b.compute_cpu_ms / a.compute_cpu_ms) FROM steps a JOIN steps b "
        "ON a.step = b.step AND a.rank = 0 AND b.rank = 1 WHERE a.step > 0").fetchall()[0][0]
    assert 2.0 < ratio < 4.0, ratio
