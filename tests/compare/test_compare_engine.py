"""probe compare on the bundled engine's own dumps: reference vs fused, planted faults."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_probe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("engine_dumps")
    runs = {
        "ref": ["--engine", "reference"],
        "fused": ["--engine", "fused"],
        "ref_scale": ["--engine", "reference", "--fault", "scale:layers.1.attn.o_proj.weight:1.5"],
        "ref_nan": ["--engine", "reference", "--fault", "nan:layers.1.mlp.down_proj:0", "--allow-nan"],
    }
    for name, extra in runs.items():
        p = run_probe("dump", "--level", "module", "--preset", "tiny", "--max-steps", "1",
                      "--out", str(root / name), *extra)
        if p.returncode != 0:
            pytest.skip(f"probe dump failed: {p.stderr.strip().splitlines()[-1:]}")
    return root


def _compare(dumps, a: str, b: str, *extra: str) -> tuple[dict, list[dict]]:
    import pyarrow.parquet as pq

    out = dumps / f"cmp_{a}_{b}"
    p = run_probe("compare", str(dumps / a), str(dumps / b), "--out", str(out), *extra)
    assert p.returncode in (0, 1), p.stderr
    return json.loads((out / "summary.json").read_text()), pq.read_table(out / "nodes.parquet").to_pylist()


def test_reference_against_fused_matches_every_module_and_passes(dumps):
    s, nodes = _compare(dumps, "ref", "fused")
    assert s["unmatched_a"] == 0 and s["unmatched_b"] == 0
    assert set(s["verdicts"]) == {"pass"} and s["first_divergence"] is None and s["first_nan"] is None
    methods = {n["match_method"] for n in nodes}
    assert "structure" in methods and "ancestor" in methods
    assert all(n["match_method"] and n["verdict"] == "pass" for n in nodes)
    fwd = {n["node_a"]: n for n in nodes if n["direction"] == "forward" and n["match_method"] == "structure"}
    assert fwd["Module.layers.0.attn.o_proj.Linear.forward.0"]["node_b"].endswith("linear_proj.Linear.forward.0")
    assert fwd["Module.lm_head.Linear.forward.0"]["node_b"] == "Module.output_layer.Linear.forward.0"


def test_planted_weight_fault_is_the_first_divergence(dumps):
    s, _ = _compare(dumps, "ref_scale", "fused")
    assert s["first_divergence"]["a"] == "Module.layers.1.attn.o_proj.Linear.forward.0"
    assert s["first_divergence"]["direction"] == "forward"
    s2, _ = _compare(dumps, "ref", "ref_scale")
    assert s2["first_divergence"]["b"] == "Module.layers.1.attn.o_proj.Linear.forward.0"


def test_planted_nan_is_the_first_nan(dumps):
    s, _ = _compare(dumps, "fused", "ref_nan")
    assert s["first_nan"]["b"] == "Module.layers.1.mlp.down_proj.Linear.forward.0"
    assert s["first_nan"]["direction"] == "forward"


def test_fail_on_error_sets_the_exit_code(dumps):
    p = run_probe("compare", str(dumps / "ref"), str(dumps / "ref_scale"), "--out",
                  str(dumps / "failon"), "--fail-on", "error")
    assert p.returncode == 1 and "first divergence" in p.stdout
    p = run_probe("compare", str(dumps / "ref"), str(dumps / "fused"), "--out",
                  str(dumps / "failon2"), "--fail-on", "warning")
    assert p.returncode == 0


def test_the_arrow_store_is_an_input_too(dumps):
    p = run_probe("compare", str(dumps / "ref" / "store"), str(dumps / "fused" / "store"),
                  "--out", str(dumps / "cmp_store"))
    assert p.returncode == 0, p.stderr
    s = json.loads((dumps / "cmp_store" / "summary.json").read_text())
    assert s["unmatched_a"] == 0 and set(s["verdicts"]) == {"pass"}
