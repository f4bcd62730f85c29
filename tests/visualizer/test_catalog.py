"""The dumps a dashboard may open: runs under its folders, their steps and ranks, and refusals
that say what to choose instead."""

import pytest

from probe.ground.errors import ProbeError
from probe.visualizer.catalog import Catalog, Choice, run_folder
from probe.visualizer.synthetic import write_dump_pair


@pytest.fixture
def root(tmp_path):
    write_dump_pair(tmp_path, blocks=2, width=3, fault_block=1)
    (tmp_path / "notes").mkdir()
    return tmp_path


def test_runs_under_the_roots_are_listed_with_their_steps_and_ranks(root):
    cat = Catalog([root])
    assert cat.runs() == [str(root / "A"), str(root / "B")]
    assert cat.steps_ranks(str(root / "A")) == ([0], [0])
    assert run_folder(root / "A" / "step0" / "rank0" / "dump.json") == root / "A"


def test_a_choice_round_trips_through_text_and_a_bad_number_is_named():
    c = Choice("/r/A", "/r/B", None, 2, 1)
    assert Choice.from_params(c.params()) == c and c.params() == {"a": "/r/A", "b": "/r/B", "step": "2", "rank": "1"}
    with pytest.raises(ProbeError, match="rank 'x' is not a number"):
        Choice.from_params({"a": "/r/A", "rank": "x"})


def test_opening_compares_now_keeps_the_result_and_refuses_what_is_not_a_dump(root, tmp_path_factory):
    cat = Catalog([root])
    opened = cat.open(Choice(str(root / "A"), str(root / "B")))
    assert opened.diff.paired and set(opened.views) == {"a", "b"}
    assert cat.open(Choice(str(root / "A"), str(root / "B"))) is opened
    with pytest.raises(ProbeError, match="holds no dump"):
        cat.open(Choice(str(root / "notes")))
    with pytest.raises(ProbeError, match="not under the folders"):
        cat.open(Choice(str(tmp_path_factory.mktemp("elsewhere"))))
    with pytest.raises(ProbeError, match="no dump of step 3"):
        cat.open(Choice(str(root / "A"), str(root / "B"), step=3))


def test_the_verdict_of_a_node_on_every_rank(tmp_path):
    import shutil

    a, b = write_dump_pair(tmp_path, blocks=2, width=3, fault_block=1)
    for run in (a, b):                       # a second rank, the same numbers
        shutil.copytree(run, run.parent / "rank1")
    cat = Catalog([tmp_path])
    opened = cat.open(Choice(str(tmp_path / "A"), str(tmp_path / "B")))
    rows = cat.rank_states(opened, "a", "Module.layers.1.mlp.MLP.forward.0")
    assert [(r["rank"], r["shown"]) for r in rows] == [(0, True), (1, False)]
    assert rows[0]["state"] == rows[1]["state"] != "absent"
