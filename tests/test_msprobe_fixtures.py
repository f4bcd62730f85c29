"""The real msprobe dumps the tests read (tests/msprobe_fixtures.py): the MindSpore ones kept in
tests/fixtures/msprobe are what msprobe writes today (MindSpore stage), and the PyTorch ones
written on the fly are one network with them."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from tests.msprobe_fixtures import KEPT, MINDSPORE_DUMPS, generate


def _same(new, kept, where: str = "") -> None:
    """Equal JSON, floats to 1e-5 relative (another CPU may round the last bits differently)."""
    if isinstance(kept, float) and isinstance(new, float) and math.isfinite(kept):
        assert new == pytest.approx(kept, rel=1e-5, abs=1e-6), where
    elif isinstance(kept, dict) and isinstance(new, dict):
        assert list(new) == list(kept), where
        for k in kept:
            _same(new[k], kept[k], f"{where}/{k}")
    elif isinstance(kept, list) and isinstance(new, list):
        assert len(new) == len(kept), where
        for i, (a, b) in enumerate(zip(new, kept)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert new == kept, where


@pytest.mark.mindspore
@pytest.mark.skipif(importlib.util.find_spec("mindspore") is None or importlib.util.find_spec("msprobe") is None,
                    reason="needs mindspore and mindstudio-probe (the MindSpore stage of scripts/test.sh)")
def test_kept_mindspore_dumps_are_what_msprobe_writes_now(tmp_path):
    generate(tmp_path, MINDSPORE_DUMPS)
    for name in MINDSPORE_DUMPS:
        for file in ("dump.json", "construct.json"):
            new = json.loads((tmp_path / name / "step0" / "proc0" / file).read_text())
            kept = json.loads((KEPT / name / "step0" / "proc0" / file).read_text())
            _same(new, kept, f"{name}/{file}")
        stack = json.loads((tmp_path / name / "step0" / "proc0" / "stack.json").read_text())
        assert [names for names, _ in stack.values()] == [
            names for names, _ in json.loads((KEPT / name / "step0" / "proc0" / "stack.json").read_text()).values()]


def test_generated_pytorch_tinynet_matches_the_kept_mindspore_one_entry_for_entry(msprobe_data):
    torch_l0 = json.loads((msprobe_data / "torch_L0" / "step0" / "proc0" / "dump.json").read_text())["data"]
    ms_l0 = json.loads((KEPT / "mindspore_L0" / "step0" / "proc0" / "dump.json").read_text())["data"]
    assert {k.replace("Cell.", "Module.").replace(".Dense.", ".Linear.") for k in ms_l0} == set(torch_l0)
    x_torch = torch_l0["Module.embed.Linear.forward.0"]["input_args"][0]
    x_ms = ms_l0["Cell.embed.Dense.forward.0"]["input_args"][0]
    for stat in ("Max", "Min", "Mean", "Norm"):          # the same input, and the same weights
        assert x_torch[stat] == pytest.approx(x_ms[stat], rel=1e-6)
    w_torch = torch_l0["Module.head.Linear.forward.0"]["parameters"]["weight"]
    w_ms = ms_l0["Cell.head.Dense.forward.0"]["parameters"]["weight"]
    assert w_torch["Norm"] == pytest.approx(w_ms["Norm"], rel=1e-6)
