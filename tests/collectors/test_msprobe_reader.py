"""collectors.msprobe_reader: msprobe's dump.json as written, into tensor and node records."""

from __future__ import annotations

import json
import math

import pytest

from probe.collectors.msprobe_layout import parse_node_name
from probe.collectors.msprobe_reader import read_msprobe_dump
from probe.ground.errors import ProbeError
from tests.compare.dumps import chain, stat, write_dump


def test_nan_and_infinity_literals_are_read_as_floats(tmp_path):
    path = write_dump(tmp_path / "step3" / "proc1234", {})
    text = json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": {
        "Tensor.masked_fill.0.forward": {"input_args": [stat(1, 0, 0.5, 1)], "input_kwargs": {},
                                         "output": [stat(1, float("-inf"), float("-inf"), float("inf"))]},
        "Torch.log.0.forward": {"input_args": [stat(1, 0, 0.5, 1)], "input_kwargs": {},
                                "output": [stat(float("nan"), float("nan"), float("nan"), float("nan"))]}}})
    assert "-Infinity" in text and "NaN" in text
    path.write_text(text)
    d = read_msprobe_dump(path)
    out = [r for r in d.tensors.to_pylist() if r["slot"] == "output"]
    assert out[0]["min"] == -math.inf and out[0]["l2norm"] == math.inf
    assert math.isnan(out[1]["max"])
    assert (d.step, d.rank) == (3, 1234)


def test_rank_folder_gives_the_rank_and_slots_follow_msprobe_keys(tmp_path):
    data, construct = chain(2)
    path = write_dump(tmp_path / "step0" / "rank5", data, construct)
    d = read_msprobe_dump(path.parent)
    assert d.rank == 5 and d.step == 0
    rows = d.tensors.to_pylist()
    slots = {(r["node"].split(".")[-2], r["slot"]) for r in rows}
    assert ("forward", "input") in slots and ("forward", "parameter") in slots
    assert ("backward", "output") in slots and ("parameters_grad", "parameter_grad") in slots
    grads = [r for r in rows if r["slot"] == "parameter_grad"]
    assert {r["direction"] for r in grads} == {"backward"}
    assert {r["index"] for r in grads} == {"weight", "bias"}
    assert d.nodes.num_rows == len(data)


def test_nested_outputs_and_non_tensor_arguments_keep_their_index_path(tmp_path):
    data = {"Functional.split.0.forward": {
        "input_args": [stat(1, 0, 0.5, 1), {"type": "int", "value": 2}],
        "input_kwargs": {"dim": {"type": "int", "value": -1}},
        "output": [[stat(1, 0, 0.5, 1), stat(1, 0, 0.5, 1)]]}}
    d = read_msprobe_dump(write_dump(tmp_path, data))
    rows = {(r["slot"], r["index"]): r for r in d.tensors.to_pylist()}
    assert rows[("output", "0.1")]["shape"] == [2, 4]
    assert rows[("input", "1")]["value"] == "2" and rows[("kwarg", "dim")]["value"] == "-1"
    assert rows[("output", "0.0")]["numel"] == 8


def test_real_mindspore_dump_reads_gamma_beta_and_framework_dtypes(msprobe_data):
    d = read_msprobe_dump(msprobe_data / "mindspore_L0" / "step0" / "proc0" / "dump.json")
    assert d.framework == "mindspore"
    idx = set(d.tensors.column("index").to_pylist())
    assert {"gamma", "beta"} <= idx
    assert set(d.tensors.column("dtype").to_pylist()) == {"Float32"}
    assert d.nodes.num_rows == 40


@pytest.mark.parametrize("text, word", [
    ('{"task": "statistics", "data": {"Module.a.Linear.forward.0": {"input_args": [', "truncated"),
    ('{"task": "statistics", "data": {"x": nope}}', "malformed"),
    ('', "empty"),
    ('[1, 2, 3]', "not an msprobe dump.json"),
    ('{"task": "statistics", "data": {}}', "empty dump"),
    ('{"data": {"Module.a.Linear.forward.0": [1, 2]}}', "not an object"),
])
def test_bad_dump_json_is_one_line_naming_the_file(tmp_path, text, word):
    p = tmp_path / "dump.json"
    p.write_text(text)
    with pytest.raises(ProbeError) as e:
        read_msprobe_dump(p)
    msg = str(e.value)
    assert str(p) in msg and word in msg and "\n" not in msg


def test_node_names_parse_for_modules_apis_and_gradients():
    assert parse_node_name("Cell.block.attn.q.Dense.backward.0") == \
        ("module", "Cell", "block.attn.q.Dense", "backward", 0)
    assert parse_node_name("Distributed.all_reduce.3.forward")[0] == "comm"
    assert parse_node_name("Tensor.__add__.12.backward") == ("api", "Tensor", "__add__", "backward", 12)
