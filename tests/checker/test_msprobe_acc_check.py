"""Our check against msprobe's acc_check on the same recorded calls: no planted fault that msprobe
finds is missed by ours.

msprobe's ``acc_check`` reads a dump.json whose tensors are ``.pt`` files and replays each call
on a CUDA or NPU device against a CPU golden. Both tests give it the same calls (the bundled
engine's first six matmul, softmax and silu calls of one step, with a planted ``perturb:Torch.matmul:1``),
saved as ``.pt`` (``benchmarks/bench_check_api.make_merged_dump``): the first runs its command
as a user would and skips, quoting its error, where it cannot run (no CUDA or NPU here); the
second runs its replay loop with its device set to the CPU (as ``benchmarks/bench_check_api.py``
does for timing).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.checker.conftest import Ran, probe_here
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

MSPROBE_PY = Path(os.environ.get("PROBE_MSPROBE_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))
PLANTED = "Torch.matmul.1"
KEEP = {"Torch.matmul", "Functional.softmax", "Functional.silu"}


def _bench():
    spec = importlib.util.spec_from_file_location("bench_check_api", ROOT / "benchmarks" / "bench_check_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def same_calls(tmp_path_factory) -> tuple[object, str, dict]:
    installed = "import importlib.util, sys; sys.exit(importlib.util.find_spec('msprobe.pytorch') is None)"
    if not MSPROBE_PY.exists() or subprocess.run([str(MSPROBE_PY), "-c", installed],
                                                 capture_output=True).returncode != 0:
        pytest.skip(f"msprobe is not installed at {MSPROBE_PY} (bash scripts/test.sh installs it)")
    bench = _bench()
    # the bench's `probe dump` runs in this process (no second import of torch)
    bench.subprocess = SimpleNamespace(run=_probe_dump_here)
    try:
        dump_json, n = bench.make_merged_dump(str(tmp_path_factory.mktemp("calls")), 6,
                                              fault=f"perturb:{PLANTED.rsplit('.', 1)[0]}:1", keep=KEEP)
    finally:
        bench.subprocess = subprocess
    assert n >= 6
    return bench, dump_json, bench.run_ours(dump_json)


def _probe_dump_here(cmd: list[str], check: bool = False, **_: object) -> Ran:
    assert cmd[1:4] == ["-m", "probe.cli", "dump"], cmd
    r = probe_here(*cmd[3:])
    assert r.returncode == 0 or not check, r.stderr
    return r


def _base(name: str) -> str:
    return name[: -len(".forward")] if name.endswith(".forward") else name


def test_msprobe_acc_check_command_on_the_same_calls(same_calls, tmp_path):
    bench, dump_json, ours = same_calls
    assert ours["first"] == f"{PLANTED}.forward" and [_base(f) for f in ours["failing"]] == [PLANTED]
    msprobe = MSPROBE_PY.parent / "msprobe"
    r = subprocess.run([str(msprobe), "acc_check", "-api_info", dump_json, "-o", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=1800)
    results = list(tmp_path.glob("accuracy_checking_result_*.csv"))
    if not results or "Set device id failed" in r.stdout + r.stderr:
        text = (r.stdout + r.stderr).splitlines()
        logged = [ln.split("[ERROR]", 1)[1].strip() for ln in text if "[ERROR]" in ln and "CANN" not in ln]
        raised = [ln.strip() for ln in text if ln.strip().startswith(("AttributeError", "RuntimeError"))]
        pytest.skip("msprobe acc_check cannot run here (it replays on a CUDA or NPU device): "
                    + " / ".join(logged[-1:] + raised[-1:]))
    import csv
    rows = list(csv.reader(open(results[0], encoding="utf-8-sig")))
    fwd = rows[0].index("Forward Test Success")
    theirs = {r[0] for r in rows[1:] if r and r[fwd].lower() == "error"}
    assert {PLANTED} & theirs <= {_base(f) for f in ours["failing"]}


def test_msprobe_replay_loop_on_the_cpu_finds_no_planted_fault_that_ours_misses(same_calls):
    bench, dump_json, ours = same_calls
    theirs = bench.run_msprobe(str(MSPROBE_PY), dump_json, timeout=1800)
    assert theirs is not None, "msprobe's acc_check loop failed on the CPU"
    assert theirs["calls"] == ours["calls"]
    found_by_them = {PLANTED} & {_base(f) for f in theirs["failing"]}
    found_by_us = {PLANTED} & {_base(f) for f in ours["failing"]}
    assert found_by_them <= found_by_us and found_by_us == {PLANTED}
