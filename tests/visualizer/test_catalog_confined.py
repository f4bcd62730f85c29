"""The graph page opens dumps only under the folders the dashboard was started on: not through a
compare result's summary.json, a symlink, or a dump path a monitor client reports."""

from __future__ import annotations

import json

import pytest

from probe.cli import main
from probe.ground.errors import ProbeError
from probe.visualizer.catalog import Catalog, Choice
from probe.visualizer.synthetic import write_dump_pair


@pytest.fixture
def places(tmp_path):
    root, outside = tmp_path / "given", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    write_dump_pair(root, blocks=2, width=3, fault_block=1)
    write_dump_pair(outside, blocks=2, width=3, fault_block=1)
    return root, outside


def test_a_compare_result_whose_summary_names_outside_dumps_is_refused(places, capsys):
    root, outside = places
    cmp = root / "cmp"
    assert main(["compare", str(root / "A"), str(root / "B"), "--out", str(cmp)]) in (0, 1)
    capsys.readouterr()
    cat = Catalog([root])
    assert cat.open(Choice(compare=str(cmp))).diff.paired          # its own dumps: under the root
    summary = json.loads((cmp / "summary.json").read_text())
    summary["a"], summary["b"] = str(outside / "A"), str(outside / "B")
    (cmp / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ProbeError, match="not under the folders"):
        Catalog([root]).open(Choice(compare=str(cmp)))


def test_a_symlink_under_a_root_to_an_outside_dump_is_refused(places):
    root, outside = places
    (root / "link").symlink_to(outside / "A")
    with pytest.raises(ProbeError, match="not under the folders"):
        Catalog([root]).open(Choice(str(root / "link")))


def test_a_reported_dump_becomes_a_root_only_under_a_given_folder(places):
    root, outside = places
    cat = Catalog([root / "A"])
    assert not cat.add_root(outside / "A")                             # the network named it
    with pytest.raises(ProbeError, match="not under the folders"):
        cat.check(str(outside / "A"))
    assert not cat.add_root(root / "B")                                # a sibling is not under A
    assert cat.add_root(root / "B", within=[root])                     # under a --store folder
    assert cat.check(str(root / "B"))
