"""Gradient accumulation with msprobe's semantics: a parameter's ``parameters_grad.N`` is its
``.grad`` after the N-th micro-batch (the sum the optimizer uses), so our dump of a run and
msprobe's dump of the same run compare with no error (issue #32: per-micro-batch contributions
gave an error for every parameter of the second micro-batch)."""

from __future__ import annotations

import pytest
import torch

from probe.compare.api import compare
from probe.dumper.session import DumpSession
from tests.msprobe_fixtures import accumulate, torch_tinynet


def test_an_accumulating_run_compares_with_msprobes_dump_of_it_with_no_error(msprobe_data, tmp_path):
    theirs = msprobe_data / "torch_L0_accum"
    if not theirs.is_dir():
        pytest.skip(f"{msprobe_data} has no msprobe dump of an accumulating run (the shared copies)")
    torch.set_num_threads(1)
    net = torch_tinynet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with DumpSession(net, out=tmp_path / "ours", level="module", auto_step=False, quiet=True) as s:
        accumulate(net)
        opt.step()
        s.step()
    r = compare(str(tmp_path / "ours"), str(theirs))
    summary = r.summary
    assert summary["unmatched_a"] == 0 and summary["unmatched_b"] == 0
    assert set(summary["verdicts"]) == {"pass"}, summary["verdicts"]
    assert summary["first_divergence"] is None
    rows = r.rows.to_pylist()
    second = [x for x in rows if ".parameters_grad.1" in x["name_a"]]
    assert second and all(x["verdict"] == "pass" for x in second)
    # the second entry is the sum of both micro-batches, not the second one alone
    head = net.head.weight.grad
    row = next(x for x in second if x["name_a"].startswith("Module.head.") and x["index"] == "weight")
    assert row["max_a"] == pytest.approx(head.max().item(), rel=1e-6)
