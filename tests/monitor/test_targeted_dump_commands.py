"""The targeted-dump command path without a training run: a loop driving the callbacks on a
small network (one rank, a thread) against a real service; bad requests refused with one line."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from probe.engine_adapter.callbacks import CallbackList, TrainContext
from probe.monitor.agent.callback import MonitorAgentCallback
from probe.monitor.client import MonitorClient
from tests.conftest import run_probe

from .conftest import wait_for


def loop(addr, tmp, job, with_model=True, steps=400, until=None):
    """One rank: a 3-layer MLP trained step by step with only the monitor agent's callback
    (given the model, or not)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    agent = MonitorAgentCallback(addr=addr, job=job, spool_path=str(tmp / f"{job}.spool"),
                                 flush_interval_s=0.02, sample_host=False)
    cbs = CallbackList([agent], rank=0)
    ctx = TrainContext(rank=0, world_size=1, run=job, out_dir=str(tmp / job), engine="script",
                       preset="", device=None, model=model if with_model else None, optimizer=opt, config=None,
                       max_steps=steps, store=None)

    def run():
        cbs.call("on_train_start", ctx)
        for step in range(steps):
            if until is not None and until.is_set():
                break
            cbs.call("on_step_start", ctx, step)
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.01)
            cbs.call("on_step_end", ctx, step, {"loss": 1.0, "step_time_ms": 10.0})
        cbs.call("on_train_end", ctx, None)

    t = threading.Thread(target=run)
    t.start()
    return t


def connected(client, job):
    def ok():
        jobs = client.status(job)["jobs"]
        return bool(jobs) and jobs[0]["ranks"][0]["connected"] and jobs[0]["ranks"][0]["last_step"] >= 0
    return ok


def test_a_script_loop_with_only_the_monitor_agent_takes_dump_orders(tmp_path, service):
    client = MonitorClient(service.address)
    done = threading.Event()
    threads = [loop(service.address, tmp_path, "with", until=done),
               loop(service.address, tmp_path, "without", with_model=False, until=done)]
    try:
        wait_for(connected(client, "with"), what="the rank with a model")
        wait_for(connected(client, "without"), what="the rank without one")
        reply = client.request_dump("with", [0], next_steps=2, scope=r"^Module\.2\.", task="tensor")
        rows = client.wait_dump(reply["dump_id"], timeout=30).to_pylist()
        refused = client.request_dump("without", [0], next_steps=1)
        no_runner = client.wait_dump(refused["dump_id"], timeout=30).to_pylist()
    finally:
        done.set()
        for t in threads:
            t.join(60)
    (row,) = rows
    assert row["state"] == "done", row["error"]
    steps = json.loads(row["steps"])
    assert len(steps) == 2 and steps[1] == steps[0] + 1
    step_dir = Path(row["path"]) / f"step{steps[0]}" / "rank0"
    data = json.loads((step_dir / "dump.json").read_text())["data"]
    assert data and all(name.startswith("Module.2.") for name in data), list(data)
    assert list((step_dir / "dump_tensor_data").glob("*.pt"))      # --task tensor: msprobe's files
    assert no_runner[0]["state"] == "failed" and "no model to dump" in no_runner[0]["error"]


def test_a_dump_asked_for_steps_already_past_or_after_the_end_says_why(tmp_path, service):
    client = MonitorClient(service.address)
    t = loop(service.address, tmp_path, "late", steps=60)
    wait_for(lambda: client.status("late")["jobs"] and
             client.status("late")["jobs"][0]["ranks"][0]["last_step"] >= 5, what="step 5")
    past = client.request_dump("late", [0], steps="0-1")
    beyond = client.request_dump("late", [0], steps="10000-10001")
    t.join(60)
    got = {r["dump_id"]: r for r in client.wait_dump(past["dump_id"], 30).to_pylist()}
    assert "already started" in got[past["dump_id"]]["error"]
    end = client.wait_dump(beyond["dump_id"], 30).to_pylist()[0]
    assert end["state"] == "failed" and "training ended" in end["error"]


@pytest.mark.parametrize("args, says", [
    (["--steps", "5-2"], "--steps"),
    (["--next", "2", "--task", "md5"], "--task"),
    (["--next", "2", "--level", "api"], "--level"),
    (["--next", "2", "--scope", "("], "not a regular expression"),
    (["--next", "2", "--scope", "x", "--module", "y"], "either --scope or --module"),
    (["--next", "2"], "no registered ranks"),
])
def test_probe_monitor_dump_refuses_bad_requests_in_one_line(args, says, service):
    res = run_probe("monitor", "dump", "--addr", service.address, "--job", "nobody", *args)
    assert res.returncode in (1, 2) and says in res.stderr, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
