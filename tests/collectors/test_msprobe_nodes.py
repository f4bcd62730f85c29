"""The module tree of an msprobe dump: a broken construct.json (older dumps) is mended on reading."""

from __future__ import annotations

import json

import pytest

from probe.collectors.msprobe_nodes import repair_tree
from probe.collectors.msprobe_reader import read_msprobe_dump
from tests.compare.dumps import stat, write_dump

NET, MLP, FC = "Module.net.Net", "Module.net.mlp.MLP", "Module.net.mlp.fc.Linear"


def _entry() -> dict:
    return {"input_args": [stat(1, -1, 0, 2)], "input_kwargs": {}, "output": [stat(1, -1, 0, 2)]}


def _broken_dump(tmp_path):
    """A forward tree that is whole and a backward tree as our recorder wrote it before its fix:
    the MLP's backward under its own child (a parent cycle), the Net's backward under a node
    that is not in the dump."""
    construct = {f"{NET}.forward.0": None, f"{MLP}.forward.0": f"{NET}.forward.0",
                 f"{FC}.forward.0": f"{MLP}.forward.0",
                 f"{FC}.backward.0": f"{MLP}.backward.0", f"{MLP}.backward.0": f"{FC}.backward.0",
                 f"{NET}.backward.0": "Module.gone.Gone.backward.0",
                 "Functional.relu.0.backward": f"{FC}.backward.0"}
    data = {name: _entry() for name in construct}
    return write_dump(tmp_path / "old", data, construct), construct


def _reaches_a_root(parents: dict) -> bool:
    for node in parents:
        seen, cur = set(), node
        while cur is not None:
            if cur in seen or cur not in parents:
                return False
            seen.add(cur)
            cur = parents[cur]
    return True


def test_a_parent_cycle_and_a_missing_parent_are_mended_with_one_warning(tmp_path, logged):
    path, construct = _broken_dump(tmp_path)
    nodes = read_msprobe_dump(path).nodes
    parents = dict(zip(nodes.column("node").to_pylist(), nodes.column("parent").to_pylist()))
    assert set(parents) == set(construct)                        # no node lost
    assert _reaches_a_root(parents)
    # backward nodes sit under the backward entry of their forward node's parent
    assert parents[f"{MLP}.backward.0"] == f"{NET}.backward.0"
    assert parents[f"{FC}.backward.0"] == f"{MLP}.backward.0"
    assert parents[f"{NET}.backward.0"] is None                 # its forward node is a root
    assert parents["Functional.relu.0.backward"] == f"{FC}.backward.0"   # not broken: kept
    depth = dict(zip(nodes.column("node").to_pylist(), nodes.column("depth").to_pylist()))
    assert depth[f"{FC}.backward.0"] == 2
    lines = [x for x in logged().splitlines() if x.strip()]
    assert len(lines) == 1 and str(tmp_path / "old" / "construct.json") in lines[0]
    assert "2 of 7 nodes re-parented" in lines[0]


def test_a_whole_tree_is_read_as_it_is_and_says_nothing(tmp_path, logged, msprobe_data):
    for dump in ("torch_L0", "mindspore_mix", "torch_llama_mix"):
        folder = next((msprobe_data / dump).glob("step0/*"))
        construct = json.loads((folder / "construct.json").read_text())
        nodes = read_msprobe_dump(folder / "dump.json").nodes
        parents = dict(zip(nodes.column("node").to_pylist(), nodes.column("parent").to_pylist()))
        assert all(parents[k] == v for k, v in construct.items())
    assert logged() == ""


def test_without_a_backward_twin_the_break_goes_to_the_top_and_the_rest_keeps_its_parent():
    parents, fixed = repair_tree({"a": "c", "b": "a", "c": "b", "d": "b", "e": "nowhere"})
    assert _reaches_a_root(parents) and fixed == 4
    assert parents == {"a": None, "b": None, "c": None, "d": "b", "e": None}


@pytest.mark.parametrize("seed", range(40))
def test_whole_tree_depths_in_numpy_equal_the_parent_walk_or_decline_a_broken_tree(seed):
    """The vectorised depths (pointer doubling) of random trees equal :func:`_depths`'s; a tree
    with a cycle or a parent that is no node is declined (None) exactly when
    :func:`repair_tree` finds it broken."""
    import random

    import pyarrow as pa

    from probe.collectors.msprobe_nodes import _depths, _reach, _whole_tree_depths

    rng = random.Random(seed)
    n = rng.randint(1, 300)
    names = [f"M.n{i}.Linear.forward.0" for i in range(n)]
    construct = {}
    for i, name in enumerate(names):
        r = rng.random()
        if i == 0 or r < 0.05:
            construct[name] = None
        elif r < 0.08 and seed % 3 == 0:
            construct[name] = names[rng.randrange(n)]          # maybe a cycle
        elif r < 0.10 and seed % 5 == 0:
            construct[name] = "M.nowhere.Linear.forward.0"     # no node at all
        elif r < 0.13:
            construct[name] = "M.entry.Only.forward.0"          # an entry, not in construct
        else:
            construct[name] = names[rng.randrange(i)]
    entries = names[: n // 2] + ["M.entry.Only.forward.0"]
    parents = [p for p in construct.values()]
    got = _whole_tree_depths(pa.array(list(construct)), pa.array(parents, pa.string()),
                             pa.array(entries))
    ok, _ = _reach(dict(construct), set(construct) | set(entries))
    if all(ok.values()):
        expected = _depths(construct)
        assert got is not None and got.to_pylist() == [expected[k] for k in construct]
    else:
        assert got is None
