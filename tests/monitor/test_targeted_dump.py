"""Targeted dumps on real bundled-engine runs (one rank, in this process) against a real service.

An operator's ``probe monitor dump`` switches a dump of one module on for exactly the asked
steps and off again, with no restart; ``probe monitor dumps`` lists where it went; ``probe
compare`` compares a clean early step with a later one of the same run by their dump.json
paths. A numerics alert, with ``dump_on_alert``, dumps the module it names on its rank.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from probe.engine_adapter.callbacks import CallbackSpec, TrainCallback
from probe.monitor.client import MonitorClient
from probe.monitor.service.server import MonitorService
from probe.monitor.targeted_dump import DUMP_DIR, module_scope
from tests.conftest import run_probe

from .conftest import wait_for

pytestmark = pytest.mark.slow

MODULE = "layers.1"


class Pacer(TrainCallback):
    """Each step lasts at least ``step_s``, so the test can ask for dumps mid-run."""

    def __init__(self, step_s: float = 0.05) -> None:
        self.step_s = step_s

    def on_step_start(self, ctx, step):
        self.t0 = time.perf_counter()

    def on_step_end(self, ctx, step, metrics):
        time.sleep(max(0.0, self.step_s - (time.perf_counter() - self.t0)))


def _train(tmp_path, monkeypatch, addr, job, steps, callbacks, faults=(), step_s=0.05):
    """Train ``job`` (one rank, in this process) on a thread; returns (thread, outcome)."""
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec

    env = {"PROBE_MONITOR": addr, "PROBE_MONITOR_JOB": job,
           "PROBE_MONITOR_SPOOL": str(tmp_path / "spool")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = RunSpec(preset="tiny", max_steps=steps, faults=tuple(faults), quiet=True,
                   out_dir=str(tmp_path / job), fsync="never",
                   extra_env=tuple(env.items()) + (("OMP_NUM_THREADS", "1"),),
                   callbacks=(CallbackSpec(Pacer, {"step_s": step_s}), *callbacks))
    outcome: dict = {}

    def train():
        try:
            outcome["result"] = run_training(spec)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            outcome["error"] = e

    thread = threading.Thread(target=train)
    thread.start()
    return thread, outcome


def _connected(client, job, at_least=0):
    def ok():
        jobs = client.status(job)["jobs"]
        ranks = jobs[0]["ranks"] if jobs else []
        return bool(ranks) and ranks[0]["connected"] and ranks[0]["last_step"] >= at_least and \
            ranks[0]["last_step"]
    return ok


def _entries(path: Path) -> dict:
    return json.loads(path.read_text())["data"]


def test_probe_monitor_dump_dumps_one_module_for_exactly_those_steps_and_compares_across_steps(
        tmp_path, monkeypatch, service):
    client = MonitorClient(service.address)
    thread, outcome = _train(tmp_path, monkeypatch, service.address, "live", 60, ())
    try:
        wait_for(_connected(client, "live"), timeout=120, what="the rank streaming")
        # a clean early step: the next one, every module
        early = client.request_dump("live", [0], next_steps=1)
        early_rows = client.wait_dump(early["dump_id"], timeout=60).to_pylist()
        wait_for(_connected(client, "live", at_least=early_rows[0]["end_step"] + 5),
                 timeout=60, what="five more steps")
        res = run_probe("monitor", "dump", "--addr", service.address, "--job", "live",
                        "--ranks", "0", "--next", "2", "--module", MODULE,
                        "--task", "statistics", "--wait", "--timeout", "60")
    finally:
        thread.join(300)
    assert "error" not in outcome, outcome.get("error")
    assert res.returncode == 0, res.stdout + res.stderr
    dump_id = re.search(r"dump (\w+):", res.stdout).group(1)
    rows = client.dumps("live", dump_id).to_pylist()
    first = rows[0]["start_step"]
    assert f"steps {first}-{first + 1}" in res.stdout
    assert [(r["rank"], r["state"], json.loads(r["steps"])) for r in rows] == \
        [(0, "done", [first, first + 1])]
    folder = Path(rows[0]["path"])
    assert folder == (tmp_path / "live" / DUMP_DIR / dump_id).resolve()
    # exactly the asked steps, and only the module asked for (and what is inside it)
    assert sorted(p.name for p in folder.glob("step*")) == [f"step{first}", f"step{first + 1}"]
    late = folder / f"step{first}" / "rank0" / "dump.json"
    names = list(_entries(late))
    scope = re.compile(module_scope(MODULE))
    assert names and all(scope.search(n) for n in names), names[:5]
    assert any(n.startswith(f"Module.{MODULE}.") and ".forward." in n for n in names)
    # the early dump has every module of its step; the dump went off again in between
    early_dump = Path(early_rows[0]["path"]) / f"step{early_rows[0]['end_step']}" / "rank0" / "dump.json"
    assert len(_entries(early_dump)) > len(names)
    all_steps = sorted(int(p.name[4:]) for p in (tmp_path / "live" / DUMP_DIR).glob("*/step*"))
    assert all_steps == [early_rows[0]["end_step"], first, first + 1]
    # the dumped steps are marked traced (the timing detectors leave them out)
    traced = client.metrics("live", names=["traced"]).to_pylist()
    assert {r["step"] for r in traced} == {early_rows[0]["end_step"], first, first + 1}
    listing = run_probe("monitor", "dumps", "--addr", service.address, "--job", "live")
    assert listing.returncode == 0 and dump_id in listing.stdout and str(folder) in listing.stdout
    # a clean early step against the targeted dump of a later one, by their dump.json paths
    cmp = run_probe("compare", str(early_dump), str(late), "--out", str(tmp_path / "cmp"))
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    # every entry of the module's dump meets its counterpart in the early step's full dump
    assert summary["matched"] > 0 and summary["unmatched_b"] == 0, summary
    assert summary["unmatched_a"] > 0, summary            # the other modules, in the early one


def test_a_numerics_alert_dumps_its_module_on_its_rank(tmp_path, monkeypatch):
    from probe.monitor.agent.numerics_callback import NumericsCallback

    layer = "layers.0.mlp.down_proj"
    svc = MonitorService(tmp_path / "m.duckdb", port=0, detect_interval_s=0.05, dump_on_alert=2)
    svc.start()
    client = MonitorClient(svc.address)
    try:
        thread, outcome = _train(tmp_path, monkeypatch, svc.address, "grow", 80,
                                 (CallbackSpec(NumericsCallback),),
                                 faults=[f"grow:{layer}.weight:7"], step_s=0.08)
        thread.join(300)
        assert "error" not in outcome, outcome.get("error")
        rows = wait_for(lambda: [r for r in client.dumps("grow").to_pylist()
                                 if r["state"] != "pending"], timeout=60, what="a dump report")
        alerts = {a["id"]: a for a in client.alerts("grow").to_pylist()}
    finally:
        svc.stop(grace=0)
    first = rows[0]
    alert = alerts[first["alert_id"]]
    assert alert["kind"].startswith("numerics")
    module = first["module"]
    assert module and module in alert["message"] and first["rank"] == alert["rank"] == 0
    assert first["reason"].startswith(f"alert {alert['id']} ")
    assert first["state"] == "done", first["error"]
    steps = json.loads(first["steps"])
    print(f"alert #{alert['id']} {alert['kind']} on {module} at step {alert['step']}: dumped "
          f"steps {steps} ({first['files']} files) in {first['path']}")
    assert len(steps) == 2 and steps[0] > alert["step"]
    names = list(_entries(Path(first["path"]) / f"step{steps[0]}" / "rank0" / "dump.json"))
    assert names and all(re.search(module_scope(module), n) for n in names)
    # once per rank and module, however often the alert recurs
    assert len({(r["rank"], r["module"]) for r in rows}) == len(rows)
