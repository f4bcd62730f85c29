"""The verdict rules of docs/compare.md ("Verdict rules"), one test (or more) each: noise-floor
tensors pass, a reason never contradicts its verdict, uninitialised memory is marked and not
graded, the headline never says "none" beside a divergence, an infinity held alike on both sides
is no NaN origin (page, CLI and summary.json agree), and a divergence born in a leaf input is
found at the first call that reads it, at API level as at module level."""

from __future__ import annotations

import json
import math

import pytest

from probe.compare.api import compare
from tests.compare.dumps import chain, stat, write_dump

_SAYS_AGREE = ("agree", "within")


def _rows(r) -> list[dict]:
    return r.rows.to_pylist()


def _nodes(r) -> list[dict]:
    return r.nodes.to_pylist()


# ------------------------------------------------------------------ noise floor
def _attention_bias_grad(noise_a: tuple, noise_b: tuple) -> tuple[dict, dict]:
    """A k_proj-like module whose bias gradient is zero in exact arithmetic: each run holds
    rounding noise around 0, next to a gradient of norm 5 flowing through the module."""
    data, construct = chain(2)
    base = "Module.layers.1.fc.Linear"
    data[f"{base}.backward.0"]["input"] = [stat(0.03, -0.03, 1e-9, 5.0, [64, 64])]
    mx, mn = noise_a
    data[f"{base}.parameters_grad.0"]["bias"] = [stat(mx, mn, (mx + mn) / 4, abs(mx) + abs(mn), [4])]
    return data, construct


def test_a_tensor_zero_in_exact_arithmetic_passes_as_rounding_noise(tmp_path):
    a = write_dump(tmp_path / "a", *_attention_bias_grad((3e-6, -2e-6), ()))
    b = write_dump(tmp_path / "b", *_attention_bias_grad((-1e-6, -3e-6), ()))
    r = compare(str(a), str(b))
    row = next(x for x in _rows(r) if x["name_a"].endswith("layers.1.fc.Linear.parameters_grad.0.bias"))
    assert row["verdict"] == "pass", row
    assert row["reason"].startswith("rounding noise"), row["reason"]
    assert r.summary["first_divergence"] is None


def test_a_small_tensor_above_the_noise_floor_is_still_graded(tmp_path):
    a = write_dump(tmp_path / "a", *_attention_bias_grad((3e-4, -2e-4), ()))
    b = write_dump(tmp_path / "b", *_attention_bias_grad((-1e-4, -3e-4), ()))
    row = next(x for x in _rows(compare(str(a), str(b)))
               if x["name_a"].endswith("layers.1.fc.Linear.parameters_grad.0.bias"))
    assert row["verdict"] == "error", row


# ------------------------------------------------------------------ reasons and verdicts
def _many_cases(tmp_path) -> list:
    """Compares with every kind of finding: scaled weights, NaN, noise, a parameter alone."""
    out = []
    base = write_dump(tmp_path / "base", *chain(5))
    for k, kw in enumerate(({"scale": {1: 1.5}}, {"scale": {2: 1.0002}}, {"nan_at": 3}, {"scale": {0: 1.01}})):
        out.append(compare(str(base), str(write_dump(tmp_path / f"b{k}", *chain(5, **kw)))))
    data, construct = chain(5)
    data["Module.layers.2.fc.Linear.forward.0"]["parameters"]["weight"] = stat(0.9, -0.5, 0.001, 2.0, [4, 4])
    out.append(compare(str(base), str(write_dump(tmp_path / "param", data, construct))))
    a = write_dump(tmp_path / "na", *_attention_bias_grad((3e-6, -2e-6), ()))
    out.append(compare(str(a), str(write_dump(tmp_path / "nb", *_attention_bias_grad((-1e-6, -3e-6), ())))))
    return out


def test_a_reason_never_says_agree_beside_an_error_or_warning(tmp_path):
    seen = set()
    for r in _many_cases(tmp_path):
        for row in _rows(r) + _nodes(r):
            seen.add(row["verdict"])
            if row["verdict"] in ("error", "warning", "nan"):
                assert not any(w in (row["reason"] or "") for w in _SAYS_AGREE), row
    assert {"pass", "warning", "error", "nan"} <= seen


# ------------------------------------------------------------------ uninitialised memory
def _filled_column_by_column(garbage: float | None) -> dict:
    """``seq = torch.empty(...)`` filled column by column, as the bundled engine's batch was: an
    API-level dump of it, the empty tensor's statistics garbage (``garbage``) or, as probe now
    dumps it, marked uninitialised with none."""
    def seq_stat() -> dict:
        s = stat(garbage, 0.0, None, None, [8, 4], dtype="torch.int64") if garbage is not None else \
            stat(None, None, None, None, [8, 4], dtype="torch.int64")
        if garbage is None:
            s["uninitialised"] = True
        return s
    col = stat(9.0, 1.0, None, None, [8], dtype="torch.int64")
    data = {"Torch.empty.0.forward": {"input_args": [], "input_kwargs": {}, "output": [seq_stat()]}}
    for i in range(3):
        data[f"Tensor.__setitem__.{i}.forward"] = {"input_args": [seq_stat(), {"type": "int", "value": i}, col],
                                                   "input_kwargs": {}, "output": [None]}
        data[f"Tensor.__getitem__.{i}.forward"] = {"input_args": [seq_stat(), {"type": "int", "value": i}],
                                                   "input_kwargs": {}, "output": [col]}
    return data


def test_garbage_statistics_of_uninitialised_memory_are_errors_the_headline_names(tmp_path):
    a = write_dump(tmp_path / "a", _filled_column_by_column(8.0e18))
    b = write_dump(tmp_path / "b", _filled_column_by_column(1.4e14))
    r = compare(str(a), str(b))
    assert any(n["verdict"] == "error" for n in _nodes(r))
    assert r.summary["first_divergence"] is not None          # never "none" beside an error
    assert r.summary["first_divergence"]["a"].startswith("Tensor.__setitem__.0")


def test_memory_marked_uninitialised_is_not_graded(tmp_path):
    a = write_dump(tmp_path / "a", _filled_column_by_column(None))
    b = write_dump(tmp_path / "b", _filled_column_by_column(None))
    r = compare(str(a), str(b))
    seq = [x for x in _rows(r) if x["name_a"].endswith(".input.0") and "item__" in x["name_a"]]
    assert seq and all(x["verdict"] == "pass" and "not compared" in x["reason"] for x in seq), seq
    assert r.summary["counts"]["tensors"]["error"] == 0
    # one side marked (a fixed run), the other with garbage: still not graded, and said so
    c = write_dump(tmp_path / "c", _filled_column_by_column(8.0e18))
    one = [x for x in _rows(compare(str(a), str(c))) if x["name_a"] == "Tensor.__setitem__.1.forward.input.0"]
    assert one[0]["verdict"] == "pass" and "no statistics in A" in one[0]["reason"], one


def test_the_dump_marks_uninitialised_memory_until_a_call_reads_it(tmp_path):
    torch = pytest.importorskip("torch")
    from probe.engine_adapter.torch_api import UninitialisedMemory

    u = UninitialisedMemory()
    seq = torch.empty((8, 4), dtype=torch.long)
    u.update("Torch.empty", ((8, 4),), {}, seq)
    for i in range(4):
        u.update("Tensor.__setitem__", (seq, (slice(None), i), 1), {}, None)
        u.update("Tensor.__getitem__", (seq, (slice(None), i)), {}, seq[:, i])
        assert seq in u
    u.update("Torch.where", (seq > 0, seq, seq), {}, seq)
    assert seq not in u and not u.live


def test_an_api_dump_carries_the_marker_and_no_statistics_of_uninitialised_memory(tmp_path):
    pytest.importorskip("torch")
    from tests.conftest import run_probe

    script = tmp_path / "fill.py"
    script.write_text("import torch\n"
                      "seq = torch.empty((8, 5), dtype=torch.long)\n"
                      "seq[:, 0] = torch.arange(8)\n"
                      "for i in range(1, 5):\n"
                      "    seq[:, i] = seq[:, i - 1] * 2 + 1\n"
                      "out = torch.where(seq > 3, seq, seq * 0).float().sum()\n")
    run_probe("dump", "--level", "api", "--out", str(tmp_path / "d"), "--", str(script))
    data = json.loads((tmp_path / "d" / "step0" / "rank0" / "dump.json").read_text())["data"]
    marked = [(k, v) for k, e in data.items() for v in (e.get("input_args", []) + e.get("output", []))
              if isinstance(v, dict) and v.get("uninitialised")]
    names = {k.rsplit(".", 2)[0] for k, _ in marked}
    assert {"Torch.empty", "Tensor.__setitem__", "Tensor.__getitem__"} <= names, names
    assert all(v["Max"] is None and v["Min"] is None for _, v in marked)
    # read by where (through __gt__ first): initialised from then on
    assert not any(v.get("uninitialised") for v in data["Torch.where.0.forward"]["input_args"][1:]
                   if isinstance(v, dict))


# ------------------------------------------------------------------ infinities and the page
def _masked(tmp_path, name: str, twice_inf: bool = True):
    data, construct = chain(3)
    mask = stat(0.0, float("-inf"), float("-inf"), float("inf"), [4, 4])
    data["Module.layers.1.fc.Linear.forward.0"]["output"] = [mask]
    data["Module.layers.2.fc.Linear.forward.0"]["input_args"] = [mask]
    return write_dump(tmp_path / name, data, construct)


def test_an_infinity_held_alike_on_both_sides_is_no_nan_origin_on_page_cli_or_summary(tmp_path):
    from probe.visualizer.diff import DiffGraph
    from probe.visualizer.navigate import first_divergence, first_nan
    from tests.conftest import run_probe

    a, b = _masked(tmp_path, "a"), _masked(tmp_path, "b")
    r = compare(str(a), str(b))
    assert r.summary["first_nan"] is None and r.summary["first_divergence"] is None
    out = run_probe("compare", str(a), str(b), "--out", str(tmp_path / "c"))
    assert "first NaN/Inf: none" in out.stdout and "first divergence: none" in out.stdout
    written = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert written["first_nan"] is None
    page = DiffGraph.from_result(r, str(a), str(b))           # what the web's graph diff shows
    assert first_nan(page) is None and first_divergence(page) is None


# ------------------------------------------------------------------ leaf inputs at API level
def _api_chain(w1: float) -> dict:
    """Two linear calls and an optimizer-like sqrt at API level; ``w1``: the second weight's
    scale (a fault planted before training)."""
    x = stat(1.0, -1.0, 0.01, 3.0)
    w0, w1s = stat(0.5, -0.5, 0.001, 2.0, [4, 4]), stat(0.5 * w1, -0.5 * w1, 0.001 * w1, 2.0 * w1, [4, 4])
    o0, o1 = stat(1.5, -1.4, 0.02, 4.0), stat(1.5 * w1, -1.4 * w1, 0.02 * w1, 4.0 * w1)
    v, s = stat(1e-4, 0.0, 1e-5, 1e-3, [4, 4]), stat(1e-2 * (1 + 0.1 * (w1 != 1)), 0.0, 1e-3, 1e-2, [4, 4])
    return {
        "Functional.linear.0.forward": {"input_args": [x, w0], "input_kwargs": {}, "output": [o0]},
        "Functional.linear.1.forward": {"input_args": [o0, w1s], "input_kwargs": {}, "output": [o1]},
        "Tensor.sqrt.0.forward": {"input_args": [v], "input_kwargs": {}, "output": [s]},
    }


def test_a_divergence_born_in_a_parameter_is_found_where_it_is_first_read_at_api_level(tmp_path):
    a = write_dump(tmp_path / "a", _api_chain(1.0))
    b = write_dump(tmp_path / "b", _api_chain(1.5))
    first = compare(str(a), str(b)).summary["first_divergence"]
    assert first["a"] == "Functional.linear.1.forward", first
    assert "Functional.linear.1.forward.input.1" in first["reason"] and "leaf" in first["reason"], first


def test_the_rules_keep_the_counts_of_an_agreeing_pair_clean(tmp_path):
    a = write_dump(tmp_path / "a", *chain(4))
    b = write_dump(tmp_path / "b", *chain(4))
    r = compare(str(a), str(b))
    assert r.summary["counts"]["tensors"]["error"] == 0 and r.summary["first_divergence"] is None
    assert all(not math.isnan(x["err"]) for x in _rows(r) if x["err"] is not None)


# ------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_two_identical_bundled_engine_runs_at_mix_level_have_no_error_verdicts(tmp_path):
    pytest.importorskip("torch")
    from tests.conftest import run_probe

    for side in ("a", "b"):
        run_probe("dump", "--level", "mix", "--max-steps", "1", "--out", str(tmp_path / side))
    r = compare(str(tmp_path / "a"), str(tmp_path / "b"))
    counts = r.summary["counts"]
    assert counts["tensors"]["error"] == 0 and counts["tensors"]["nan"] == 0, counts
    assert counts["nodes"]["error"] == 0 and r.summary["first_divergence"] is None
