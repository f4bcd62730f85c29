"""The API precision check's flagged calls marked on the graph of the dump they were found in: the
call (class, badge, its row in the detail panel) and every module holding one (class, count
badge, the list in the detail panel); the result found next to the dump or given."""

from __future__ import annotations

import shutil

import pytest
import torch

from probe.checker.offline import check_dump
from probe.checker.report import write
from probe.ground.errors import ProbeError
from probe.dumper.session import DumpSession
from probe.visualizer.catalog import Catalog, Choice
from probe.visualizer.check_marks import CheckMarks
from probe.visualizer.detail import detail

CALL = "Functional.linear.0.forward"
BLOCK = "Module.0.Block.forward.0"


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 32)
        self.act = torch.nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.proj(x))


def checked_run(out):
    """A mix-level tensor dump of a model run under bfloat16 autocast in ``out``, and ``probe
    check-api``'s result in its default place (``OUT/check``): both linears are errors (float32
    inputs, bfloat16 outputs), the tanh passes."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(Block(), torch.nn.Linear(32, 4))
    with DumpSession(net, out=str(out), level="mix", task="tensor", auto_step=False, store=False, quiet=True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = net(torch.randn(8, 16))
        y.float().sum().backward()
    rows, summary = check_dump(out)
    write(rows, summary, out / "check")
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return checked_run(tmp_path_factory.mktemp("runs") / "run")


def _entries(opened) -> dict:
    view = opened.views["a"]
    return {e["n"]: e for e in view.full(set(view.graph.nodes))["add"]}


def test_flagged_calls_and_the_modules_holding_them_are_marked_with_the_reason(run):
    opened = Catalog([run.parent]).open(Choice(a=str(run)))
    by = _entries(opened)
    call = by[CALL]
    assert "check-error" in call["c"].split() and call["l"].startswith("✗ error Functional.linear.0")
    assert "check-in" in by[BLOCK]["c"].split() and by[BLOCK]["l"].startswith("✗1 ")
    tanh = by["Module.0.act.Tanh.forward.0"]
    assert "check" not in tanh["c"] and not tanh["l"].startswith("✗")
    assert "check" not in by["Torch.tanh.0.forward"]["c"]
    assert "check-error" in by["Functional.linear.1.forward"]["c"]
    assert not any("check" in e["c"] for n, e in by.items() if n.endswith(".backward.0"))
    # the box is as wide as the label with its badge
    view = opened.views["a"]
    assert view.layout.leaf_size(CALL)[0] > view.layout.leaf_size("Functional.linear.0.backward")[0]

    checks = view.checks
    d = detail(opened.diff, "a", CALL, checks)
    assert d.check["verdict"] == "error" and "computed in bfloat16 from float32 inputs" in d.check["reason"]
    d = detail(opened.diff, "a", BLOCK, checks)
    assert d.check is None and [(n, v) for n, _, v, _ in d.check_inside] == [(CALL, "error")]
    assert "computed in bfloat16" in d.check_inside[0][3]

    from probe.web.pages.graph_detail import render_detail
    text = str(render_detail(opened.diff, "a", CALL, checks=checks))
    assert "API precision check" in text and "computed in bfloat16 from float32 inputs" in text
    assert "1 flagged call inside" in str(render_detail(opened.diff, "a", BLOCK, checks=checks))


def test_a_check_result_given_elsewhere_marks_the_dump_and_none_marks_nothing(run, tmp_path):
    moved = tmp_path / "runs" / "run"
    shutil.copytree(run, moved)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(moved / "check"), elsewhere)
    plain = Catalog([moved.parent]).open(Choice(a=str(moved)))
    assert plain.views["a"].checks is None
    assert not any("check" in e["c"] or e["l"].startswith("✗") for e in _entries(plain).values())
    given = Catalog([moved.parent], checks={moved: elsewhere}).open(Choice(a=str(moved)))
    assert "check-error" in _entries(given)[CALL]["c"]
    with pytest.raises(ProbeError, match="no check_api.parquet"):
        Catalog([moved.parent], checks={moved: tmp_path}).open(Choice(a=str(moved)))


def test_only_flagged_rows_of_the_dumps_step_and_rank_mark():
    rows = [{"step": 0, "rank": 0, "name": "Torch.exp.0.forward", "verdict": "pass"},
            {"step": 0, "rank": 1, "name": "Torch.exp.1.forward", "verdict": "error"},
            {"step": 1, "rank": 0, "name": "Torch.exp.2.forward", "verdict": "error"},
            {"step": 0, "rank": 0, "name": "Torch.exp.3.forward", "verdict": "warning"},
            {"step": 0, "rank": 0, "name": "Torch.exp.4.forward", "verdict": "skipped"}]
    marks = CheckMarks(rows, step=0, rank=0)
    assert list(marks.rows) == ["Torch.exp.3.forward"] and len(CheckMarks(rows)) == 3


def test_probe_web_check_refuses_in_one_line_what_it_cannot_mark(run, tmp_path, monkeypatch):
    import probe.web.app
    from tests.checker.conftest import probe_here

    monkeypatch.setattr(probe.web.app, "serve", lambda *a, **k: pytest.fail("served despite a bad --check"))
    for args, needle in ((("--dump", str(run), "--check", str(tmp_path)), "no check_api.parquet"),
                         (("--check", str(run / "check")), "give the dump too"),
                         (("--dump", str(run), "--check", str(run / "check"), "--check", str(run / "check")),
                          "one --check per dump")):
        r = probe_here("web", "--port", "0", *args)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
