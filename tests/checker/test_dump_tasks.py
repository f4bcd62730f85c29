"""``probe dump --task check`` (the check during the run) and ``--task overflow``; the runs are
``probe`` in this process (:func:`tests.checker.conftest.probe_here`)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import probe
from tests.checker.conftest import probe_here
from tests.conftest import run_probe

pytestmark = pytest.mark.slow


def test_online_check_finds_the_planted_kernel_without_writing_a_tensor(tmp_path):
    out = tmp_path / "d"
    r = probe_here("dump", "--level", "mix", "--task", "check", "--steps", "1", "--out", str(out),
                  "--fault", "perturb:Torch.matmul:1")
    assert r.returncode == 0, r.stderr
    rows = pq.read_table(out / "check" / "rank0" / "check_api.parquet").to_pylist()
    summary = json.loads((out / "check" / "rank0" / "summary.json").read_text())
    assert summary["first_failure"]["name"] == "Torch.matmul.1.forward" and summary["steps"] == [1]
    assert summary["first_failure"]["parent"] == "Module.layers.0.attn.Attention.forward.0"
    assert {r["step"] for r in rows} == {1}
    assert [r["name"] for r in rows if r["verdict"] == "error"] == ["Torch.matmul.1.forward"]
    assert not list(out.rglob("*.safetensors")) and not list(out.rglob("dump.json"))
    assert "first failing call: Torch.matmul.1.forward" in r.stdout
    done = json.loads((out / "dump_summary.json").read_text())
    assert done["task"] == "check" and done["first_failure"]["name"] == "Torch.matmul.1.forward"


def test_online_check_needs_api_calls_and_says_so_in_one_line(tmp_path):
    r = run_probe("dump", "--task", "check", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "use --level api or mix" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_overflow_stops_at_the_planted_nan_and_writes_its_inputs_stack_and_module_path(tmp_path):
    out = tmp_path / "o"
    r = probe_here("dump", "--level", "mix", "--task", "overflow", "--steps", "0-2", "--out", str(out),
                  "--fault", "nan:layers.1.mlp:1")
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "dump_summary.json").read_text())
    first = doc["first"]
    assert first["name"] == "Module.layers.1.mlp.MLP.forward.0" and first["step"] == 1
    assert first["module_path"] == ["Module.layers.1.Block.forward.0"] and len(doc["hits"]) == 1
    assert doc["steps_watched"] == [0, 1]              # stopped at the hit: step 2 not watched
    folder = out / "step1" / "rank0"
    dump = json.loads((folder / "dump.json").read_text())
    assert dump["task"] == "overflow_check" and list(dump["data"]) == [first["name"]]
    entry = dump["data"][first["name"]]
    files = [e["data_name"] for e in entry["input_args"] + entry["output"]]
    assert all((folder / "dump_tensor_data" / f).is_file() for f in files) and len(files) == 2
    out_t = torch.load(folder / "dump_tensor_data" / files[1]) if files[1].endswith(".pt") else None
    if out_t is None:
        from safetensors.torch import load_file
        out_t = next(iter(load_file(str(folder / "dump_tensor_data" / files[1])).values()))
    assert int(out_t.isnan().sum()) == 1
    stack = json.loads((folder / "stack.json").read_text())
    assert any("model_reference.py" in line for group in stack.values() for line in group[1])
    assert json.loads((folder / "construct.json").read_text())[first["name"]] == "Module.layers.1.Block.forward.0"
    assert not (out / "step0").exists() and not (out / "step2").exists()


def test_a_run_without_overflow_writes_nothing_but_the_summary(tmp_path):
    # (store/ and config/ are the engine run's own step metrics and setup record, as in every run)
    out = tmp_path / "o"
    r = probe_here("dump", "--level", "mix", "--task", "overflow", "--steps", "0-1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir() if p.name not in ("store", "config", ".probe-outputs.json")) == \
        ["dump_summary.json", "overflow_rank0.json"]
    doc = json.loads((out / "dump_summary.json").read_text())
    assert doc["hits"] == [] and doc["outputs_watched"] > 1000 and "no NaN/Inf" in r.stdout


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8).half()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.full((8,), float("-inf"), dtype=torch.float16)      # an Inf from its argument: no overflow
        h = self.lin(x) + mask.clamp(min=-1)
        big = (h * 3e4) * 4.0                                             # fp16 overflows here: hit 1
        carried = big - 1.0                                               # the Inf carried on: no hit
        return carried, torch.ones(2, dtype=torch.float16) * 65504.0    # at the fp16 limit: hit 2


def test_overflow_in_half_precision_is_where_an_inf_is_created_not_where_one_is_carried_in(tmp_path):
    torch.manual_seed(0)
    net = _Scaled()
    with probe.dump(net, out=str(tmp_path / "o"), level="mix", task="overflow", max_hits=2,
                    auto_step=False, store=False, quiet=True):
        net(torch.ones(2, 8, dtype=torch.float16))
    doc = json.loads((tmp_path / "o" / "overflow_rank0.json").read_text())
    names = [h["name"] for h in doc["hits"]]
    assert names == ["Tensor.__mul__.1.forward", "Tensor.__mul__.2.forward"], names
    assert "Inf" in doc["hits"][0]["what"] and "at the float16 limit" in doc["hits"][1]["what"]
    assert doc["carried_in"] >= 2               # the -inf fill's clamp input and big - 1.0
    dump = json.loads((tmp_path / "o" / "step0" / "rank0" / "dump.json").read_text())
    assert sorted(dump["data"]) == sorted(names)
