"""Comparing two setup records (compare.config_diff): JSON only, hand-made records."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from probe.compare.config_diff import check_configs, compare_records, format_summary, load_side
from probe.ground.errors import ProbeError


def record(rank: int = 0, **changes) -> dict:
    base = {
        "format": "probe-config", "version": 1,
        "run": {"rank": rank, "world_size": 2, "pid": 100 + rank, "host": "node1", "time": "t0",
                "argv": ["probe", "train", "--out", "runs/a"], "out_dir": "/x/runs/a", "run": "a"},
        "platform": {"python": "3.11.7", "cuda": None, "cpu_capability": "AVX2", "device": "cpu"},
        "packages": {"torch": "2.3.0", "numpy": "1.26.4", "rich": "13.7.0"},
        "environment": {"OMP_NUM_THREADS": "4", "TERM": "xterm", "MASTER_PORT": "29500",
                        "HF_TOKEN": "<redacted>"},
        "determinism": {"seed": 0, "torch_initial_seed": 0, "torch_rng_state": "aaaa",
                        "numpy_rng_state": "n1", "python_rng_state": "p1",
                        "deterministic_algorithms": False, "cudnn_benchmark": False},
        "hyperparameters": {"engine": "reference",
                            "optimizers": [{"class": "AdamW", "param_groups": [{"lr": 0.003, "params": 3}]}]},
        "model": {"class": "Net", "modules": [["", "Net"], ["fc", "Linear"]],
                  "parameters": {"fc.weight": {"dtype": "float32", "shape": [2, 2], "checksum": "w1"},
                                 "fc.bias": {"dtype": "float32", "shape": [2], "checksum": "b1"}},
                  "buffers": {}},
        "batches": [{"step": 0, "inputs": [{"path": "args.0", "dtype": "int64", "shape": [2, 8],
                                            "checksum": f"x0r{rank}"}]}],
    }
    for dotted, value in changes.items():
        node = base
        *path, last = dotted.split("__")
        for part in path:
            node = node[part]
        node[last] = value
    return base


def diff(a: dict, b: dict):
    return compare_records({0: a}, {0: b}, files=True)


def keys(findings) -> list[str]:
    return [f.key for f in findings]


def test_identical_setups_with_other_pids_hosts_times_and_paths_are_the_same():
    b = record(run__pid=999, run__host="node7", run__time="t9", run__out_dir="/y/runs/b",
               run__argv=["probe", "train", "--out", "runs/b"], run__run="b",
               environment__TERM="screen", environment__MASTER_PORT="41000",
               environment__TRITON_CACHE_DIR="/home/b/.triton",
               determinism__numpy_rng_state="n2", determinism__python_rng_state="p2")
    report = diff(record(), b)
    assert report.causes == [] and report.exit_code == 0
    assert set(keys(report.noise)) == {"run.pid", "run.host", "run.time", "run.out_dir", "run.argv",
                                       "run.run", "environment.TERM", "environment.MASTER_PORT",
                                       "environment.TRITON_CACHE_DIR",
                                       "determinism.numpy_rng_state", "determinism.python_rng_state"}


def test_a_different_seed_is_the_one_cause_and_weights_data_and_random_state_follow_from_it():
    b = record(determinism__seed=1, determinism__torch_initial_seed=1, determinism__torch_rng_state="bbbb")
    b["model"]["parameters"]["fc.weight"]["checksum"] = "w2"
    b["batches"][0]["inputs"][0]["checksum"] = "other"
    report = diff(record(), b)
    assert [(f.key, f.a, f.b) for f in report.causes] == [("determinism.seed", 0, 1)]
    assert {f.key: f.follows for f in report.follows} == {
        "determinism.torch_initial_seed": "determinism.seed", "determinism.torch_rng_state": "determinism.seed",
        "model.weights": "determinism.seed", "batches": "determinism.seed"}
    text = "\n".join(format_summary(report))
    assert "determinism.seed: 0 vs 1" in text and "weights at step 0: 1 of 2 tensors differ (fc.weight)" in text


def test_causes_are_ranked_data_seed_framework_hyperparameters_environment_packages():
    b = record(packages__rich="14.0", environment__OMP_NUM_THREADS="8", packages__numpy="2.0.0",
               determinism__deterministic_algorithms=True)
    b["hyperparameters"]["optimizers"][0]["param_groups"][0]["lr"] = 0.001
    b["model"]["parameters"]["fc.bias"]["checksum"] = "b2"
    report = diff(record(), b)
    assert keys(report.causes) == ["model.weights", "determinism.deterministic_algorithms",
                                   "packages.numpy", "hyperparameters.optimizers[0].param_groups[0].lr",
                                   "environment.OMP_NUM_THREADS", "packages.rich"]
    assert [f.category for f in report.causes] == ["data", "seed", "framework", "hyperparameters",
                                                   "environment", "packages"]
    assert report.follows == [] and report.exit_code == 1


def test_a_package_only_on_one_side_and_a_changed_world_size_explain_divergence():
    b = record(run__world_size=4)
    b["packages"]["triton"] = "3.0.0"
    report = diff(record(), b)
    assert [(f.key, f.a, f.b) for f in report.causes] == [("packages.triton", "<absent>", "3.0.0"),
                                                          ("run.world_size", 2, 4)]


def test_model_structure_differences_are_named():
    b = record()
    b["model"]["modules"].append(["drop", "Dropout"])
    b["model"]["parameters"]["fc.weight"]["dtype"] = "bfloat16"
    (finding,) = diff(record(), b).causes
    assert finding.key == "model.structure"
    assert finding.detail == {"modules only in B": ["drop"],
                              "parameters: dtype": ["fc.weight: float32 vs bfloat16"]}


def test_ranks_are_paired_by_number_and_equal_findings_merged(tmp_path):
    for side, numpy in (("a", "1.26.4"), ("b", "2.0.0")):
        (tmp_path / side / "config").mkdir(parents=True)
        for rank in range(3 if side == "a" else 2):
            rec = record(rank, packages__numpy=numpy)
            (tmp_path / side / "config" / f"rank{rank}.json").write_text(json.dumps(rec))
    report = check_configs(str(tmp_path / "a"), str(tmp_path / "b"))
    assert report.pairs == [(0, 0), (1, 1)]
    assert [(f.key, f.ranks) for f in report.causes] == [("packages.numpy", [0, 1])]
    assert report.notes == [f"ranks only in {tmp_path / 'a'}: 2"]
    one_file = check_configs(str(tmp_path / "a" / "config" / "rank1.json"), str(tmp_path / "b" / "config"))
    assert one_file.pairs == [(1, 1)]


def test_batches_are_compared_only_at_steps_both_runs_recorded():
    b = record()
    b["batches"].append({"step": 1, "inputs": []})
    assert diff(record(), b).causes == []


def test_report_json_lists_causes_follows_and_noise():
    b = record(determinism__seed=5, run__pid=1)
    out = diff(record(), b).to_json()
    assert out["verdict"] == "differs" and out["exit_code"] == 1
    assert out["causes"][0]["key"] == "determinism.seed" and out["causes"][0]["priority"] == 2
    assert [f["key"] for f in out["not_explaining"]] == ["run.pid"]
    json.dumps(out)


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON"),
    ('{"format": "other"}', "not a probe setup record"),
    ('{"format": "probe-config", "version": 99}', "version 99"),
    ('{"format": "probe-config", "version": 1, "packages": []}', "'packages' is a list"),
    ('{"format": "probe-config", "version": 1, "run": {"rank": "x"}}', "run.rank"),
    ("[]", "not a probe setup record"),
])
def test_bad_records_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "rank0.json"
    path.write_text(content)
    with pytest.raises(ProbeError, match=message) as e:
        load_side(str(path))
    assert "\n" not in str(e.value)


def test_a_folder_without_records_says_how_to_make_one(tmp_path):
    with pytest.raises(ProbeError, match="no recorded setup.*record_config"):
        load_side(str(tmp_path))
    with pytest.raises(ProbeError, match="no such file or folder"):
        load_side(str(tmp_path / "missing"))


def test_folders_without_a_common_rank_are_bad_input():
    with pytest.raises(ProbeError, match="none in common"):
        compare_records({0: record()}, {1: record(1)})


def test_the_diff_never_imports_torch():
    code = ("import sys, compare.config_diff, probe.commands.config_check; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_record_is_not_changed_by_comparing_it():
    a = record()
    before = copy.deepcopy(a)
    diff(a, record(packages__numpy="0"))
    assert a == before
