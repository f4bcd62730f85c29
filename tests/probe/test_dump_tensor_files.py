"""Tensor files of the ``tensor`` task: one file per tensor, whatever the module names, named and
written as msprobe's own dump does (``.pt`` through ``torch.save``; ``.safetensors`` on request),
and a tensor-mode compare that reads the right file for each pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from probe.collectors.msprobe_writer import safe_file_name
from probe.dumper.session import DumpSession
from probe.dumper.rows import MAX_FILE_STEM, SLOT_CATEGORIES, tensor_file_name
from tests.conftest import ROOT, run_probe

LONG = "L" * 300
#: submodule names that clean up to one string, or are cut to one, with the old naming
NAMES = ("a/b", "a_b", "a b", "a\\b", "ünï/名", "__n__/_", LONG, LONG[:-1] + "M", LONG + "/")


def _net(perturb: str | None = None) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Module()
    for name in NAMES:
        net.add_module(name, nn.Linear(4, 3))
    if perturb is not None:
        with torch.no_grad():
            net.get_submodule(perturb).weight.add_(0.05)
    return net


def _dump(out: Path, net: nn.Module, **options) -> Path:
    x = torch.linspace(-1, 1, 8).reshape(2, 4).requires_grad_()
    with DumpSession(net, out=out, task="tensor", store=False, auto_step=False, **options):
        outs = [m(x) for m in net.children()]
        sum(o.square().sum() for o in outs).backward()
    return out / "step0" / "rank0"


def _data_names(entry: object) -> list[str]:
    if isinstance(entry, dict):
        if "data_name" in entry:
            return [entry["data_name"]]
        return [n for v in entry.values() for n in _data_names(v)]
    if isinstance(entry, list):
        return [n for v in entry for n in _data_names(v)]
    return []


def _load(path: Path) -> torch.Tensor:
    if path.suffix == ".safetensors":
        return load_file(str(path))["tensor"]
    assert path.suffix == ".pt"
    return torch.load(path, weights_only=True)


def test_file_names_are_distinct_safe_and_keep_the_slot_suffix():
    nodes = [f"Module.{n}.Linear.forward.0" for n in NAMES]
    cases = [(node, slot, index) for node in nodes for slot, index in
             (("input", "0"), ("output", "0"), ("parameter", "weight"), ("kwarg", "k" * 80))]
    names = [tensor_file_name(*c) for c in cases]
    assert len(set(names)) == len(cases)
    for (node, slot, index), name in zip(cases, names):
        assert len(name) <= MAX_FILE_STEM
        assert safe_file_name(name) == name            # the recorder's cleaning leaves it whole
        if len(index) < 40:
            assert name.endswith(f".{SLOT_CATEGORIES[slot]}.{index}")
    kept = tensor_file_name("Module.a_b.Linear.forward.0", "output", "0")
    assert kept == "Module.a_b.Linear.forward.0.output.0"
    hashed = tensor_file_name("Module.a/b.Linear.forward.0", "output", "0")
    node, _, _ = hashed.rpartition(".output.0")        # a dump name spelled as that file name
    assert tensor_file_name(node, "output", "0") != hashed


def test_file_names_are_the_same_in_every_process():
    code = ("import sys; from probe.dumper.rows import tensor_file_name as f; "
            "print(*[f('Module.' + n + '.Linear.forward.0', 'input', '0') for n in sys.argv[1:]])")
    runs = [subprocess.run([sys.executable, "-c", code, *NAMES], cwd=ROOT, capture_output=True,
                           text=True, check=True, env=dict(os.environ, PYTHONHASHSEED=seed)).stdout
            for seed in ("1", "2")]
    here = " ".join(tensor_file_name(f"Module.{n}.Linear.forward.0", "input", "0") for n in NAMES)
    assert runs == [here + "\n"] * 2


def test_colliding_long_and_unicode_module_names_each_get_their_own_files(tmp_path):
    folder = _dump(tmp_path / "a", _net())
    dump = json.loads((folder / "dump.json").read_text())
    for name in NAMES:                                 # the full names stay in dump.json
        assert f"Module.{name}.Linear.forward.0" in dump["data"]
    data_names = _data_names(dump["data"])
    files = sorted(p.name for p in (folder / "dump_tensor_data").iterdir())
    assert len(data_names) == len(set(data_names)) == len(files)
    assert sorted(data_names) == files
    for name in NAMES:                                 # each file holds its own module's tensor
        entry = dump["data"][f"Module.{name}.Linear.forward.0"]
        out = _load(folder / "dump_tensor_data" / entry["output"][0]["data_name"])
        weight = _load(folder / "dump_tensor_data" / entry["parameters"]["weight"]["data_name"])
        assert torch.equal(weight, _net().get_submodule(name).weight.detach())
        assert out.max().item() == pytest.approx(entry["output"][0]["Max"])


def test_tensor_mode_compare_grades_the_planted_module_and_only_it(tmp_path):
    a = _dump(tmp_path / "a", _net())
    b = _dump(tmp_path / "b", _net(perturb="a/b"))
    r = run_probe("compare", str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert r.returncode == 0, r.stderr
    rows = pq.read_table(tmp_path / "cmp" / "compare.parquet").to_pylist()
    assert rows and all(row["cosine"] is not None for row in rows)   # every file was read
    assert all(row["node_a"] == row["node_b"] for row in rows)
    planted = {(row["direction"], row["slot"], row["index"]): row for row in rows
               if row["node_a"].startswith("Module.a/b.Linear.")}
    for key in (("forward", "output", "0"), ("forward", "parameter", "weight"),
                ("backward", "output", "0")):
        assert planted[key]["max_abs_err"] > 1e-3 and planted[key]["verdict"] == "error", key
    others = [row for row in rows if not row["node_a"].startswith("Module.a/b.Linear.")]
    assert {row["node_a"].split(".Linear.")[0][len("Module."):] for row in others} == set(NAMES) - {"a/b"}
    assert all(row["max_abs_err"] == 0 and row["verdict"] == "pass" for row in others)


def test_files_are_msprobes_pt_named_as_msprobe_names_them(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3))
    folder = _dump(tmp_path / "a", net)
    files = {p.name for p in (folder / "dump_tensor_data").iterdir()}
    assert files == {
        "Module.0.Linear.forward.0.input.0.pt", "Module.0.Linear.forward.0.output.0.pt",
        "Module.0.Linear.forward.0.parameters.weight.pt", "Module.0.Linear.forward.0.parameters.bias.pt",
        "Module.0.Linear.backward.0.input.0.pt", "Module.0.Linear.backward.0.output.0.pt",
        "Module.0.Linear.parameters_grad.0.weight.pt", "Module.0.Linear.parameters_grad.0.bias.pt",
    }
    dump = json.loads((folder / "dump.json").read_text())
    assert sorted(_data_names(dump["data"])) == sorted(files)
    for name in files:                       # each file is a plain tensor holding only its data
        t = _load(folder / "dump_tensor_data" / name)
        assert type(t) is torch.Tensor and not t.requires_grad
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    grad = _load(folder / "dump_tensor_data" / "Module.0.Linear.parameters_grad.0.weight.pt")
    assert grad.shape == net[0].weight.shape and torch.equal(grad, net[0].weight.grad)


def test_safetensors_stays_a_choice(tmp_path):
    folder = _dump(tmp_path / "a", _net(), tensor_format="safetensors")
    files = list((folder / "dump_tensor_data").iterdir())
    assert files and all(p.suffix == ".safetensors" for p in files)
    dump = json.loads((folder / "dump.json").read_text())
    entry = dump["data"]["Module.a_b.Linear.forward.0"]
    weight = _load(folder / "dump_tensor_data" / entry["parameters"]["weight"]["data_name"])
    assert torch.equal(weight, _net().get_submodule("a_b").weight.detach())


def test_a_link_planted_under_a_file_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    folder = tmp_path / "a" / "step0" / "rank0" / "dump_tensor_data"
    folder.mkdir(parents=True)
    (folder / "Module.0.Linear.forward.0.output.0.pt").symlink_to(victim)
    torch.manual_seed(0)
    _dump(tmp_path / "a", nn.Sequential(nn.Linear(4, 3)))
    assert victim.read_bytes() == b"keep"
