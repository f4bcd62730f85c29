"""compare.api.compare on real msprobe dumps and on hand-made ones: matching, verdicts, localisation."""

from __future__ import annotations

import json
import math

import pytest

from probe.compare.api import compare, load_result
from tests.compare.dumps import chain, stat, write_dump


def test_mindspore_against_pytorch_matches_every_entry_and_passes(msprobe_data, tmp_path):
    r = compare(str(msprobe_data / "mindspore_L0" / "step0" / "proc0" / "dump.json"),
                str(msprobe_data / "torch_L0"))
    s = r.summary
    assert s["unmatched_a"] == 0 and s["unmatched_b"] == 0
    assert s["matched"] == 30 and s["match_methods"] == {"exact": 30}
    assert s["verdicts"] == {"pass": 99}
    assert s["first_divergence"] is None and s["first_nan"] is None
    rows = r.rows.to_pylist()
    assert {(x["dtype_a"], x["dtype_b"]) for x in rows} == {("float32", "float32")}
    gamma = [x for x in rows if x["name_a"].endswith("parameters.gamma")]
    assert gamma and all(x["name_b"].endswith("parameters.weight") and x["index"] == "weight" for x in gamma)
    assert max(x["err"] for x in rows) < 1e-5


def test_result_writes_and_reads_back_with_strict_json_summary(msprobe_data, tmp_path):
    r = compare(str(msprobe_data / "torch_L0"), str(msprobe_data / "mindspore_L0"))
    out = r.write(tmp_path / "cmp")
    for name in ("compare.csv", "compare.parquet", "nodes.parquet", "summary.json"):
        assert (out / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    for key in ("matched", "unmatched_a", "unmatched_b", "verdicts", "first_divergence", "first_nan"):
        assert key in summary
    back = load_result(out)
    assert back.rows.num_rows == r.rows.num_rows and back.nodes.num_rows == r.nodes.num_rows
    header = (out / "compare.csv").read_text().splitlines()[0]
    for col in ("name_a", "name_b", "match_method", "verdict", "reason", "max_rel", "norm_diff"):
        assert f'"{col}"' in header


def test_md5_dump_compared_with_itself_is_identical(msprobe_data):
    p = str(msprobe_data / "torch_llama_md5_L1")
    r = compare(p, p)
    assert r.summary["unmatched_a"] == 0 and set(r.summary["verdicts"]) == {"pass"}
    assert all(h in (True, None) for h in r.rows.column("hash_match").to_pylist())
    assert r.summary["first_nan"] is None  # the causal mask's -inf is in both runs identically


def test_cell_prefix_and_dense_names_match_module_and_linear(tmp_path):
    a, ca = chain(3, prefix="Cell", cls="Dense")
    b, cb = chain(3)
    r = compare(str(write_dump(tmp_path / "a", a, ca, "mindspore")), str(write_dump(tmp_path / "b", b, cb)))
    assert r.summary["match_methods"] == {"exact": 6} and r.summary["verdicts"] == {"pass": r.rows.num_rows}


def test_weight_fault_is_the_first_divergence_not_its_descendants(tmp_path):
    a, c = chain(5)
    b, _ = chain(5, scale={2: 1.1})
    r = compare(str(write_dump(tmp_path / "a", a, c)), str(write_dump(tmp_path / "b", b, c)))
    fd = r.summary["first_divergence"]
    assert fd == {"a": "Module.layers.2.fc.Linear.forward.0", "b": "Module.layers.2.fc.Linear.forward.0",
                  "direction": "forward", "reason": fd["reason"]}
    assert "weight" in fd["reason"]
    nodes = {(n["node_a"], n["direction"]): n for n in r.nodes.to_pylist()}
    assert nodes[("Module.layers.1.fc.Linear.forward.0", "forward")]["verdict"] == "pass"
    assert nodes[("Module.layers.3.fc.Linear.forward.0", "forward")]["verdict"] == "error"
    assert nodes[("Module.layers.2.fc.Linear.forward.0", "forward")]["precision_band"] in ("low", "medium", "high")


def test_first_nan_is_where_it_appears_in_either_run(tmp_path):
    a, c = chain(5)
    b, _ = chain(5, nan_at=3)
    r = compare(str(write_dump(tmp_path / "a", a, c)), str(write_dump(tmp_path / "b", b, c)))
    assert r.summary["first_nan"]["b"] == "Module.layers.3.fc.Linear.forward.0"
    assert "in B" in r.summary["first_nan"]["reason"]
    r2 = compare(str(write_dump(tmp_path / "b2", b, c)), str(write_dump(tmp_path / "a2", a, c)))
    assert r2.summary["first_nan"]["a"] == "Module.layers.3.fc.Linear.forward.0"


def test_non_finite_values_held_identically_by_both_runs_are_not_a_finding(tmp_path):
    mask = stat(0.0, float("-inf"), float("-inf"), float("inf"))
    data = {"Tensor.masked_fill.0.forward": {"input_args": [stat(1, 0, 0.5, 2)], "input_kwargs": {},
                                             "output": [mask]},
            "Functional.softmax.0.forward": {"input_args": [mask], "input_kwargs": {},
                                             "output": [stat(1, 0, 0.25, 1)]}}
    r = compare(str(write_dump(tmp_path / "a", data)), str(write_dump(tmp_path / "b", data)))
    assert r.summary["first_nan"] is None and r.summary["first_divergence"] is None
    assert set(r.summary["verdicts"]) == {"pass"}


def test_rounding_noise_in_near_zero_statistics_is_not_a_divergence(tmp_path):
    a, c = chain(3)
    b, _ = chain(3)
    for key, entry in b.items():
        if key.endswith("parameters_grad.0"):
            entry["bias"][0]["Mean"] = -3e-12          # zero in exact arithmetic: noise flips sign
            entry["bias"][0]["Max"] = 1.3e-9
        if key.endswith("backward.0"):
            entry["input"][0]["Mean"] = 1.7e-9        # a mean of gradients: relative error 70%
    r = compare(str(write_dump(tmp_path / "a", a, c)), str(write_dump(tmp_path / "b", b, c)))
    assert set(r.summary["verdicts"]) == {"pass"}
    rel = [x["mean_rel"] for x in r.rows.to_pylist() if x["mean_rel"] is not None]
    assert max(rel) > 0.5  # msprobe's plain relative error would have flagged it


def test_dtype_tolerance_is_looser_for_bfloat16(tmp_path):
    def one(dtype: str, mx: float) -> dict:
        return {"Module.fc.Linear.forward.0": {"input_args": [stat(1, -1, 0.0, 2, dtype=dtype)],
                                               "input_kwargs": {}, "output": [stat(mx, -1, 0.0, 2, dtype=dtype)]}}
    for dtype, verdict in (("torch.bfloat16", "pass"), ("torch.float32", "error")):
        r = compare(str(write_dump(tmp_path / dtype / "a", one(dtype, 1.0))),
                    str(write_dump(tmp_path / dtype / "b", one(dtype, 1.01))))
        out = [x for x in r.rows.to_pylist() if x["slot"] == "output"][0]
        assert out["verdict"] == verdict, (dtype, out)


def test_structure_matches_renamed_modules_and_covers_a_fused_one_at_its_ancestor(tmp_path):
    x = stat(1.0, -1.0, 0.01, 3.0, [2, 8])

    def lin(inp: dict, out_shape: list[int], w: list[int], norm: float) -> dict:
        return {"input_args": [inp], "input_kwargs": {}, "output": [stat(1, -1, 0.0, norm, out_shape)],
                "parameters": {"weight": stat(0.5, -0.5, 0.0, norm / 2, w)}}
    a = {"Module.attn.q.Linear.forward.0": lin(x, [2, 8], [8, 8], 1.1),
         "Module.attn.k.Linear.forward.0": lin(x, [2, 8], [8, 8], 1.2),
         "Module.attn.o.Linear.forward.0": lin(stat(2, -2, 0, 5, [2, 8]), [2, 8], [8, 8], 1.3),
         "Module.attn.Attention.forward.0": {"input_args": [x], "input_kwargs": {},
                                             "output": [stat(1, -1, 0.0, 1.3, [2, 8])]}}
    ca = {k: "Module.attn.Attention.forward.0" for k in a if "Attention" not in k}
    ca["Module.attn.Attention.forward.0"] = None
    b = {"Module.self_attn.qk.Linear.forward.0": lin(x, [2, 16], [16, 8], 1.6),
         "Module.self_attn.proj.Linear.forward.0": lin(stat(2, -2, 0, 5, [2, 8]), [2, 8], [8, 8], 1.3),
         "Module.self_attn.SelfAttention.forward.0": {"input_args": [x], "input_kwargs": {},
                                                      "output": [stat(1, -1, 0.0, 1.3, [2, 8])]}}
    cb = {k: "Module.self_attn.SelfAttention.forward.0" for k in b if "SelfAttention" not in k}
    cb["Module.self_attn.SelfAttention.forward.0"] = None
    r = compare(str(write_dump(tmp_path / "a", a, ca)), str(write_dump(tmp_path / "b", b, cb)))
    nodes = {(n["node_a"], n["node_b"]): n for n in r.nodes.to_pylist() if n["direction"] == "forward"}
    assert nodes[("Module.attn.o.Linear.forward.0", "Module.self_attn.proj.Linear.forward.0")]["match_method"] == "structure"
    assert nodes[("Module.attn.Attention.forward.0", "Module.self_attn.SelfAttention.forward.0")]["match_method"] == "structure"
    for fused in ("Module.attn.q.Linear.forward.0", "Module.attn.k.Linear.forward.0"):
        n = nodes[(fused, "Module.self_attn.SelfAttention.forward.0")]
        assert n["match_method"] == "ancestor" and "nearest common ancestor" in n["reason"]
    assert nodes[("Module.attn.Attention.forward.0", "Module.self_attn.qk.Linear.forward.0")]["match_method"] == "ancestor"
    assert r.summary["unmatched_a"] == 0 and r.summary["unmatched_b"] == 0
    assert r.summary["verdicts"].get("error", 0) == 0


def test_two_dumps_with_nothing_in_common_report_zero_matched(tmp_path):
    a = {"Module.fc.Linear.forward.0": {"input_args": [stat(1, -1, 0, 2, [3, 5])], "input_kwargs": {},
                                        "output": [stat(1, -1, 0, 2, [3, 7])]}}
    b = {"Functional.conv2d.0.forward": {"input_args": [stat(1, -1, 0, 2, [1, 3, 9, 9])], "input_kwargs": {},
                                         "output": [stat(1, -1, 0, 2, [1, 4, 7, 7])]}}
    r = compare(str(write_dump(tmp_path / "a", a)), str(write_dump(tmp_path / "b", b)))
    assert r.summary["matched"] == 0 and r.summary["unmatched_a"] == 1 and r.summary["unmatched_b"] == 1
    assert set(r.summary["verdicts"]) == {"unmatched"}


def test_statistics_metrics_are_differences_and_relative_errors(tmp_path):
    a = {"Module.fc.Linear.forward.0": {"input_args": [], "input_kwargs": {}, "output": [stat(2.0, -1.0, 0.5, 4.0)]}}
    b = {"Module.fc.Linear.forward.0": {"input_args": [], "input_kwargs": {}, "output": [stat(2.5, -1.0, 0.5, 5.0)]}}
    r = compare(str(write_dump(tmp_path / "a", a)), str(write_dump(tmp_path / "b", b)))
    row = r.rows.to_pylist()[0]
    assert row["max_diff"] == 0.5 and math.isclose(row["max_rel"], 0.25) and math.isclose(row["norm_rel"], 0.25)
    assert row["verdict"] == "error" and "differs" in row["reason"]


def test_tensor_mode_adds_element_metrics_and_grades_on_them(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = x.copy()
    y[0, 0] += 0.05  # one element off: the statistics barely move, the elements do
    for side, arr in (("a", x), ("b", y)):
        d = tmp_path / side / "dump_tensor_data"
        d.mkdir(parents=True)
        np.save(d / "out.npy", arr)
        np.save(d / "in.npy", x)

    def entry(arr):
        def s(v, f):
            return dict(stat(float(v.max()), float(v.min()), float(v.mean()), float(np.linalg.norm(v)), [4, 8]),
                        data_name=f)
        return {"Module.fc.Linear.forward.0": {"input_args": [s(x, "in.npy")], "input_kwargs": {},
                                               "output": [s(arr, "out.npy")]}}
    r = compare(str(write_dump(tmp_path / "a", entry(x), task="tensor")),
                str(write_dump(tmp_path / "b", entry(y), task="tensor")))
    rows = {x_["slot"]: x_ for x_ in r.rows.to_pylist()}
    assert r.summary["mode"] == "tensor"
    assert rows["input"]["cosine"] == pytest.approx(1.0) and rows["input"]["verdict"] == "pass"
    out = rows["output"]
    assert out["max_abs_err"] == pytest.approx(0.05, rel=1e-3) and out["one_thousandth"] == pytest.approx(31 / 32)
    assert out["verdict"] == "error" and "elements differ" in out["reason"]
    assert r.summary["first_divergence"]["a"] == "Module.fc.Linear.forward.0"


def test_api_level_dump_matches_a_mix_dump_of_the_same_run(msprobe_data):
    r = compare(str(msprobe_data / "torch_llama_mix"), str(msprobe_data / "torch_llama_md5_L1"))
    s = r.summary
    assert s["unmatched_a"] == 0 and s["unmatched_b"] == 0
    assert set(s["verdicts"]) == {"pass"}
    methods = {(n["kind"], n["match_method"]) for n in r.nodes.to_pylist()}
    assert ("api", "exact") in methods and ("module", "container") in methods
    pairs = {(x["node_a"], x["node_b"]) for x in r.rows.to_pylist()}
    assert ("Tensor.mul_.0.forward", "Tensor.__mul__.0.forward") not in pairs  # in-place stays apart
