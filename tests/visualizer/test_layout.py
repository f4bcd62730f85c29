"""The layered layout: boxes nest in their parent, never overlap, and follow the data flow down."""

import pytest

from probe.visualizer.graph import Graph
from probe.visualizer.layout import GAP_Y, Layout
from probe.visualizer.synthetic import write_dump_pair


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    a, _ = write_dump_pair(tmp_path_factory.mktemp("pair"), blocks=4, width=12, fault_block=1)
    return Graph.load(a)


def overlap(p, q):
    return p.x < q.x + q.w and q.x < p.x + p.w and p.y < q.y + q.h and q.y < p.y + p.h


def test_children_sit_inside_their_parent_without_overlapping(graph):
    lay = Layout(graph)
    expanded = set(graph.roots()) | {n for n in graph if n.endswith("mlp.MLP.forward.0")}
    boxes = lay.boxes(expanded)
    for parent in [None] + sorted(expanded):
        kids = graph.roots() if parent is None else graph.children(parent)
        for i, k in enumerate(kids):
            if parent is not None:
                box, b = boxes[parent], boxes[k]
                assert 0 < b.x and b.x + b.w < box.w and 0 < b.y and b.y + b.h < box.h, (parent, k)
            for other in kids[i + 1:]:
                assert not overlap(boxes[k], boxes[other]), (k, other)


def test_a_node_fed_by_a_sibling_sits_in_a_lower_row(graph):
    lay = Layout(graph)
    block = "Module.layers.1.Block.forward.0"
    boxes = lay.boxes({block})
    kids = graph.children(block)
    for e in graph.flow():
        if e.src in kids and e.dst in kids and kids.index(e.src) < kids.index(e.dst):
            assert boxes[e.dst].y >= boxes[e.src].y + boxes[e.src].h + GAP_Y - 1e-6, e


def test_opening_a_node_moves_only_what_follows_it_and_its_ancestors(graph):
    lay = Layout(graph)
    roots = graph.roots()
    before = lay.boxes(set())
    after = lay.boxes({roots[2]})
    assert [after[r] == before[r] for r in roots[:2]] == [True, True]
    assert after[roots[2]].h > before[roots[2]].h
    assert all(after[r].y > before[r].y for r in roots[3:])
