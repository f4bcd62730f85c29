"""Finished steps survive ``kill -9`` at any moment: 20 kills at seeded random times."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from probe.collectors.store import StoreWriter, open_store
from probe.ground.errors import ProbeError
from tests.conftest import ROOT

WRITER = """
import sys
from probe.collectors.store import StoreWriter
w = StoreWriter(sys.argv[1], rank=0, run="kill", fsync=sys.argv[2])
step = 0
while True:
    w.write_rows("metric", [{"time_ns": step, "job": "kill", "rank": 0, "step": step,
                             "name": f"m{i}", "value": float(step)} for i in range(200)])
    w.end_step(step)
    print(step, flush=True)
    step += 1
"""


@pytest.mark.parametrize("fsync", ["step", "never"])
def test_every_finished_step_survives_kill_9_at_random_moments(tmp_path, fsync):
    rng = random.Random(20261124)
    for attempt in range(20 if fsync == "step" else 5):
        run = tmp_path / f"run{attempt}"
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(run), fsync], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert child.stdout.readline().strip() == "0"         # running: step 0 is finished
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        finished = {0} | {int(line) for line in child.stdout.read().split()}
        rows = open_store(run).sql(
            "select step, count(*) from metrics group by step order by step").fetchall()
        steps = {step for step, _ in rows}
        assert finished <= steps, f"attempt {attempt}: finished steps lost: {sorted(finished - steps)}"
        assert all(n == 200 for _, n in rows), f"attempt {attempt}: a step is in the store by halves"
        assert len(steps - finished) <= 1            # at most the step in flight when killed


def test_step_durability_forces_segments_to_disk_off_the_callers_thread(tmp_path, monkeypatch):
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    with StoreWriter(tmp_path, fsync="step") as w:
        w.write_rows("metric", [{"time_ns": 0, "job": "j", "rank": 0, "step": 0, "name": "loss",
                                 "value": 1.0}])
        w.end_step(0)
        assert w.sync(10)
    assert len(synced) >= 2                          # the segment and its folder
    synced.clear()
    with StoreWriter(tmp_path / "n", fsync="never") as w:
        w.write_rows("metric", [{"time_ns": 0, "job": "j", "rank": 0, "step": 0, "name": "loss",
                                 "value": 1.0}])
        w.end_step(0)
    assert synced == []


def test_a_bad_fsync_mode_is_one_line(tmp_path):
    with pytest.raises(ProbeError, match="--fsync 'always': use one of step, never"):
        StoreWriter(tmp_path, fsync="always")
