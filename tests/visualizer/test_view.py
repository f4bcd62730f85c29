"""A side's view: entries carry the node's own verdict; a delta takes a client from one view to
another exactly (the same entries and edges as drawing the second view from scratch)."""

import random

import pytest

from probe.visualizer.diff import DiffGraph, NodePair
from probe.visualizer.graph import Graph
from probe.visualizer.synthetic import write_dump_pair
from probe.visualizer.view import SideView


@pytest.fixture(scope="module")
def diff(tmp_path_factory):
    a, b = write_dump_pair(tmp_path_factory.mktemp("pair"), blocks=5, width=10, fault_block=2)
    ga, gb = Graph.load(a), Graph.load(b)
    return DiffGraph(ga, gb, [NodePair(n, n, "name") for n in ga if n in gb if "head" not in n])


class Client:
    """What the page's script does with a delta (web/assets/view_model.js), in Python."""

    def __init__(self):
        self.nodes, self.edges = {}, set()

    def apply(self, delta):
        if delta.get("reset"):
            self.nodes, self.edges = {}, set()
        for p in delta["prune"]:
            stack = [n for n, e in self.nodes.items() if e["p"] == p]
            while stack:
                n = stack.pop()
                stack += [m for m, e in self.nodes.items() if e["p"] == n]
                del self.nodes[n]
        for e in delta["add"]:
            self.nodes[e["n"]] = dict(e)
        for e in delta["set"]:
            self.nodes[e["n"]].update(e)
        self.edges -= {tuple(e) for e in delta["er"]}
        self.edges |= {tuple(e) for e in delta["ea"]}
        return self


def test_entries_wear_the_nodes_own_verdict_and_marks(diff):
    view = SideView(diff, "a")
    full = view.full({"Module.layers.2.Block.forward.0"})
    by = {e["n"]: e for e in full["add"]}
    assert "band-error" in by["Module.layers.2.mlp.MLP.forward.0"]["c"]
    assert by["Module.layers.2.Block.forward.0"]["o"] == 1
    assert by["Module.layers.3.Block.forward.0"]["h"] == "" or by["Module.layers.3.Block.forward.0"]["o"] == 0
    assert "nomatch" in by["Module.head.Linear.forward.0"]["c"] and by["Module.head.Linear.forward.0"]["t"] is None
    assert by["Module.layers.2.mlp.MLP.forward.0"]["t"] == "Module.layers.2.mlp.MLP.forward.0"


def test_edges_are_lifted_to_the_visible_nodes(diff):
    view = SideView(diff, "a")
    g = diff.graph("a")
    collapsed = {tuple(e) for e in view.full(set())["ea"]}
    assert ("Module.layers.1.Block.forward.0", "Module.layers.2.Block.forward.0") in collapsed
    assert all(s in g.roots() and t in g.roots() for s, t in collapsed)


def test_a_delta_takes_the_client_exactly_to_the_new_view(diff):
    view = SideView(diff, "a")
    g = diff.graph("a")
    openable = [n for n in g.walk() if g.has_children(n)]
    rng = random.Random(7)
    expanded: set = set()
    client = Client().apply(view.full(expanded))
    for _ in range(25):
        new = set(expanded)
        for n in rng.sample(openable, rng.randint(1, 3)):
            new ^= {n}
        client.apply(view.delta(expanded, new))
        truth = Client().apply(view.full(new))
        assert client.nodes == truth.nodes and client.edges == truth.edges
        expanded = new


def test_a_delta_sends_only_what_changed(diff):
    view = SideView(diff, "a")
    g = diff.graph("a")
    block = "Module.layers.3.Block.forward.0"
    d = view.delta(set(), {block})
    assert {e["n"] for e in d["add"]} == set(g.children(block))
    roots = g.roots()
    moved = {e["n"] for e in d["set"]}
    assert block in moved and moved <= set(roots) and roots[0] not in moved
    assert view.delta({block}, {block}) == {"add": [], "prune": [], "set": [], "ea": [], "er": []}
    assert view.delta({block}, set())["prune"] == [block]


def test_a_hidden_node_lifts_to_the_closed_box_that_holds_it(diff):
    view = SideView(diff, "a")
    g = diff.graph("a")
    mlp = "Module.layers.2.mlp.MLP.forward.0"
    inner = g.children(mlp)[0]
    assert view.lift(inner, set()) == "Module.layers.2.Block.forward.0"
    assert view.lift(inner, {"Module.layers.2.Block.forward.0"}) == mlp
    assert view.lift(inner, {"Module.layers.2.Block.forward.0", mlp}) == inner
