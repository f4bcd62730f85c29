"""On 4 ranks of the bundled engine, a fault planted on one rank: the flight recorder's rings name
its origin exactly, with no rerun (a forward NaN, a backward-only NaN, an overflow to Inf, a
loss spike without NaN)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_probe

CASES = {
    # fault: (step, rank, module, direction, tensor, trigger)
    "nan:layers.1.mlp@2:5": (5, 2, "layers.1.mlp", "forward", "output.0", "nonfinite"),
    "nangrad:layers.1.attn@1:5": (5, 1, "layers.1.attn", "backward", "output.0", "nonfinite"),
    "overflow:layers.0.mlp@3:4": (4, 3, "layers.0.mlp", "forward", "output.0", "nonfinite"),
    "spike:norm@0:7": (7, 0, "norm", "forward", "output.0", "spike"),
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", list(CASES))
def test_the_origin_of_a_fault_on_one_rank_of_four_is_named_exactly(fault, tmp_path):
    out = tmp_path / "run"
    p = run_probe("train", "--nproc", "4", "--max-steps", "9", "--flight-recorder", "8",
                  "--fault", fault, "--out", str(out), "--quiet")
    assert p.returncode in (0, 4), p.stderr
    step, rank, module, direction, tensor, trigger = CASES[fault]
    markers = sorted((out / "flight_recorder").glob("rank*.json"))
    assert [m.name for m in markers] == [f"rank{r}.json" for r in range(4)]   # every rank wrote
    assert {json.loads(m.read_text())["trigger"] for m in markers} == {trigger}
    o = run_probe("origin", str(out), "--json")
    assert o.returncode == 0, o.stderr
    found = json.loads(o.stdout)
    assert (found["step"], found["rank"], found["module"], found["direction"], found["tensor"]) == \
        (step, rank, module, direction, tensor), found["evidence"]
    assert f"rank {rank}" in found["evidence"]
