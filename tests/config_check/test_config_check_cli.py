"""``probe config-check`` end to end: bundled-engine runs, an edited record, scripts, bad input."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from tests.conftest import run_probe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three one-step tiny runs: seeds 0, 1 and 0 again."""
    root = tmp_path_factory.mktemp("runs")
    for name, seed in (("s0", 0), ("s1", 1), ("s0again", 0)):
        done = run_probe("train", "--preset", "tiny", "--max-steps", "1", "--seed", str(seed),
                         "--out", str(root / name))
        assert done.returncode == 0, done.stderr[-2000:]
    return root


def test_runs_differing_only_by_seed_name_exactly_the_seed(runs, tmp_path):
    out = tmp_path / "check.json"
    done = run_probe("config-check", str(runs / "s0"), str(runs / "s1"), "--out", str(out))
    assert done.returncode == 1, done.stderr
    report = json.loads(out.read_text())
    assert [(c["key"], c["a"], c["b"]) for c in report["causes"]] == [("determinism.seed", 0, 1)]
    assert {f["key"] for f in report["follows"]} >= {"model.weights", "batches",
                                                      "determinism.torch_initial_seed"}
    noise = {f["key"] for f in report["not_explaining"]}
    assert {"run.pid", "run.time", "run.out_dir"} <= noise
    assert "1. [seed] determinism.seed: 0 vs 1" in done.stdout


def test_two_runs_of_the_same_setup_are_the_same(runs):
    done = run_probe("config-check", str(runs / "s0"), str(runs / "s0again"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no difference that can explain the runs diverging" in done.stdout


def test_a_changed_package_version_is_named_and_nothing_else(runs, tmp_path):
    record = json.loads((runs / "s0again" / "config" / "rank0.json").read_text())
    record["packages"]["numpy"] = "0.9.0"
    edited = tmp_path / "rank0.json"
    edited.write_text(json.dumps(record))
    out = tmp_path / "check.json"
    done = run_probe("config-check", str(runs / "s0" / "config" / "rank0.json"), str(edited),
                     "--out", str(out))
    assert done.returncode == 1, done.stderr
    causes = json.loads(out.read_text())["causes"]
    assert [(c["key"], c["b"], c["category"]) for c in causes] == [("packages.numpy", "0.9.0", "framework")]


def test_a_rerun_into_the_same_folder_replaces_its_record(runs, tmp_path):
    out = tmp_path / "again"
    shutil.copytree(runs / "s1", out)
    done = run_probe("train", "--preset", "tiny", "--max-steps", "1", "--seed", "0", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert run_probe("config-check", str(runs / "s0"), str(out)).returncode == 0


SCRIPT = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(int(sys.argv[1]))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[2]))
    for step in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
""")


def test_scripts_recorded_by_config_check_and_by_dump_compare(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    rec = run_probe("config-check", "--record", str(tmp_path / "a"), "--", str(script), "1", "0.1")
    assert rec.returncode == 0, rec.stderr
    assert "recorded the setup of" in rec.stdout
    dump = run_probe("dump", "--out", str(tmp_path / "b"), "--", str(script), "1", "0.2")
    assert dump.returncode == 0, dump.stderr
    out = tmp_path / "check.json"
    done = run_probe("config-check", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out))
    assert done.returncode == 1, done.stderr
    causes = json.loads(out.read_text())["causes"]
    assert [(c["key"], c["a"], c["b"]) for c in causes] == [
        ("hyperparameters.optimizers[0].param_groups[0].lr", 0.1, 0.2)]


def test_an_environment_only_record_compares_with_a_run(runs, tmp_path):
    done = run_probe("config-check", "--record", str(tmp_path / "env"))
    assert done.returncode == 0, done.stderr
    check = run_probe("config-check", str(tmp_path / "env"), str(runs / "s0"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "only B recorded a model" in check.stdout


@pytest.mark.parametrize("args, message", [
    (["only-one"], "give two runs to compare"),
    (["missing-a", "missing-b"], "no such file or folder"),
    (["--record", "x", "--out", "y.json"], "--out names the comparison"),
    (["--record", "x", "--", "no-such-script.py"], "no such script"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = run_probe("config-check", *args, cwd=str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
