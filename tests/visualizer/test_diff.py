import pytest

from probe.visualizer.bands import band, node_score
from probe.visualizer.detail import detail
from probe.visualizer.diff import DiffGraph, NodePair
from probe.visualizer.graph import Graph, TensorStat
from probe.visualizer.navigate import filter_nodes, first_divergence, first_nan, reveal, search
from probe.visualizer.search import find, fuzzy_score
from probe.visualizer.synthetic import write_dump_pair


def _by_name(ga, gb):
    """Hand-made compare pairs: same names on both sides (the synthetic pair's convention)."""
    return [NodePair(n, n, "name") for n in ga if n in gb]


@pytest.fixture(scope="module")
def diff(tmp_path_factory):
    a, b = write_dump_pair(tmp_path_factory.mktemp("pair"), blocks=6, width=9, fault_block=3)
    ga, gb = Graph.load(a), Graph.load(b)
    return DiffGraph(ga, gb, _by_name(ga, gb))


def test_bands_follow_msprobe_thresholds():
    assert [band(s) for s in (0.0, 0.29, 0.3, 0.59, 0.6, 1.0)] == [
        "pass", "pass", "warning", "warning", "error", "error"]


def test_score_is_error_growth_from_inputs_to_outputs():
    a_in, a_out = TensorStat("input", "0", "f", (2,), 1, -1, 0, 2), TensorStat("output", "0", "f", (2,), 3, -3, 0, 6)
    b_out = TensorStat("output", "0", "f", (2,), 1, -1, 0, 2)
    assert node_score([a_in, a_out], [a_in, b_out]) >= 0.6
    # an error passed on unchanged from the inputs does not colour the node
    assert node_score([TensorStat("input", "0", "f", (2,), 3, -3, 0, 6), a_out],
                      [a_in, b_out]) == 0.0


def test_faulty_module_is_error_and_first_divergence_lands_inside_it(diff):
    mlp = "Module.layers.3.mlp.MLP.forward.0"
    assert diff.band("a", mlp) == "error"
    assert diff.band("a", "Module.layers.4.mlp.MLP.forward.0") == "pass"
    side, node = first_divergence(diff)
    assert side == "a" and diff.graph("a").nodes[node].parent == mlp
    assert diff.worst_below("a", "Module.layers.3.Block.forward.0") == "error"
    assert diff.worst_below("a", "Module.layers.2.Block.forward.0") == "pass"


def test_filter_lists_error_nodes_in_execution_order(diff):
    errors = [n for _, n in filter_nodes(diff, ["error"])]
    order = diff.graph("a").walk()
    assert errors and errors == sorted(errors, key=order.index)
    assert "Module.layers.3.mlp.MLP.forward.0" in errors


def test_unmatched_nodes_are_grey_on_each_side(tmp_path):
    a, b = write_dump_pair(tmp_path, blocks=2, width=3)
    ga, gb = Graph.load(a), Graph.load(b)
    pairs = [p for p in _by_name(ga, gb) if "head" not in p.node_a]
    d = DiffGraph(ga, gb, pairs)
    assert d.band("a", "Module.head.Linear.forward.0") == "unmatched"
    assert d.band("b", "Module.head.Linear.forward.0") == "unmatched"
    assert ("b", "Module.head.Linear.forward.0") in filter_nodes(d, ["unmatched"])
    assert detail(d, "a", "Module.head.Linear.forward.0").reason.startswith("no counterpart")


def test_first_nan_is_the_innermost_node_that_produces_it(tmp_path):
    a, b = write_dump_pair(tmp_path, blocks=3, width=3, fault_block=1, nan=True)
    ga, gb = Graph.load(a), Graph.load(b)
    d = DiffGraph(ga, gb, _by_name(ga, gb))
    side, node = first_nan(d)
    assert side == "b" and gb.nodes[node].parent == "Module.layers.1.mlp.MLP.forward.0"
    assert ("b", node) in filter_nodes(d, ["nan"])


def test_compare_result_scores_and_summary_are_used_when_given(diff):
    class Result:
        nodes = [{"node_a": "Module.head.Linear.forward.0", "node_b": "Module.head.Linear.forward.0",
                  "match_method": "structure", "verdict": "error", "precision_score": 0.9, "reason": "big"}]
        rows = [{"node_a": "Module.head.Linear.forward.0", "node_b": "Module.head.Linear.forward.0",
                 "slot": "output", "index": "0", "metrics": {"cosine": 0.5}}]
        summary = {"first_divergence": "Module.head.Linear.forward.0"}
    d = DiffGraph.from_result(Result(), diff.graph("a"), diff.graph("b"))
    assert d.band("a", "Module.head.Linear.forward.0") == "error"
    assert first_divergence(d) == ("a", "Module.head.Linear.forward.0")
    det = detail(d, "b", "Module.head.Linear.forward.0")
    assert det.match_method == "structure" and det.reason == "big" and len(det.metrics) == 1
    assert d.band("a", "Module.embed.Embedding.forward.0") == "unmatched"


def test_search_is_fuzzy_case_insensitive_and_in_execution_order(diff):
    hits = search(diff, "LAYERS.3 mlp")
    assert hits[0] == ("a", "Module.layers.3.mlp.MLP.forward.0")
    assert search(diff, "l3mlp")  # scattered letters still find it
    assert fuzzy_score("zzz", "Module.embed") is None
    assert find("proj", ["x.q_proj", "x.pr_oj", "y.proj"]) == ["x.q_proj", "y.proj"]


def test_reveal_expands_ancestors_on_both_sides(diff):
    node = "Module.layers.3.mlp.MLP.forward.0"
    assert reveal(diff, "a", node) == {"a": ["Module.layers.3.Block.forward.0"],
                                      "b": ["Module.layers.3.Block.forward.0"]}


def test_single_dump_has_no_bands_but_finds_nan(tmp_path):
    _, b = write_dump_pair(tmp_path, blocks=2, width=3, fault_block=0, nan=True)
    d = DiffGraph(Graph.load(b))
    assert d.band("a", d.graph("a").roots()[0]) == "none"
    assert first_divergence(d) is None and first_nan(d)[0] == "a"


def test_a_node_compared_only_at_its_ancestor_is_unmatched_but_still_syncs(diff):
    ga, gb = diff.graph("a"), diff.graph("b")
    mlp, lin = "Module.layers.1.mlp.MLP.forward.0", ga.children("Module.layers.1.mlp.MLP.forward.0")[0]
    pairs = [NodePair(lin, mlp, "ancestor", "pass", None, "compared at the nearest matched ancestor"),
             NodePair(mlp, "Module.layers.0.mlp.MLP.forward.0", "ancestor"),
             NodePair(mlp, mlp, "structure", "pass", 0.1),
             NodePair(None, lin, "unmatched")]
    d = DiffGraph(ga, gb, pairs)
    assert d.band("a", mlp) == "pass" and d.counterpart("a", mlp) == mlp     # the direct pair wins
    assert d.band("a", lin) == "unmatched" and d.counterpart("a", lin) == mlp
    assert detail(d, "a", lin).reason == "compared at the nearest matched ancestor"
    assert ("b", lin) in filter_nodes(d, ["unmatched"])


def _compared(tmp_path, **fault):
    from probe.compare.api import compare
    from tests.compare.dumps import chain, write_dump

    a, c = chain(5)
    b, _ = chain(5, **fault)
    pa_, pb = write_dump(tmp_path / "a", a, c), write_dump(tmp_path / "b", b, c)
    r = compare(str(pa_), str(pb))
    return r, DiffGraph.from_result(r, pa_.parent, pb.parent), pa_, pb


def test_a_node_is_coloured_by_its_own_verdict_and_told_origin_or_affected(tmp_path):
    r, d, _, _ = _compared(tmp_path, scale={2: 1.5})
    fault, later = "Module.layers.2.fc.Linear.forward.0", "Module.layers.3.fc.Linear.forward.0"
    # the precision band says the later node adds no error; its colour is still its own verdict
    assert d.band("a", later) == "pass" and d.state("a", later) == d.state("b", later) == "error"
    assert d.impact("a", later) == ("affected", ("a", fault))
    assert d.impact("a", fault) == ("origin", None) and d.state("a", fault) == "error"
    assert d.state("a", "Module.layers.1.fc.Linear.forward.0") == "pass"
    assert detail(d, "a", later).state == "error"
    assert d.labelled_counts() == r.summary["counts"]          # the same truth as summary.json


def test_a_node_with_nan_on_one_side_is_nan_and_listed_where_it_is(tmp_path):
    _, d, _, _ = _compared(tmp_path, nan_at=3)
    node = "Module.layers.3.fc.Linear.forward.0"
    assert d.state("a", node) == "nan" and d.state("a", "Module.layers.4.fc.Linear.forward.0") == "nan"
    assert d.impact("a", "Module.layers.4.fc.Linear.forward.0") == ("affected", ("a", node))
    assert ("b", node) in filter_nodes(d, ["nan"]) and d.counts()["nan"] >= 2


def test_a_compare_result_of_other_dumps_is_refused(tmp_path):
    from tests.compare.dumps import chain, write_dump

    r, _, pa_, pb = _compared(tmp_path, scale={2: 1.5})
    r.write(tmp_path / "cmp")
    other = write_dump(tmp_path / "other", *chain(5, scale={1: 3.0}))
    refused = DiffGraph.from_dumps(pa_.parent, other.parent, tmp_path / "cmp")
    assert "belongs to other dumps" in refused.refusal and "side B" in refused.refusal
    assert str(other) in refused.refusal
    assert DiffGraph.from_dumps(pa_.parent, pb.parent, tmp_path / "cmp").refusal is None
    assert DiffGraph.from_dumps(None, None, tmp_path / "cmp").refusal is None
    pb.write_text(pb.read_text().replace("0.5", "0.25"))        # the dump changed since
    assert DiffGraph.from_dumps(None, None, tmp_path / "cmp").refusal


def test_every_node_of_a_dump_with_a_broken_tree_is_in_the_tree_and_found(tmp_path):
    from tests.compare.dumps import stat, write_dump

    construct = {"Module.net.Net.forward.0": None, "Module.net.fc.Linear.forward.0": "Module.net.Net.forward.0",
                 "Module.net.fc.Linear.backward.0": "Module.net.Net.backward.0",
                 "Module.net.Net.backward.0": "Module.net.fc.Linear.backward.0"}
    entry = {"input_args": [stat(1, -1, 0, 2)], "input_kwargs": {}, "output": [stat(1, -1, 0, 2)]}
    path = write_dump(tmp_path / "d", {k: entry for k in construct}, construct)
    g = Graph.load(path)
    assert sorted(g.walk()) == sorted(g)
    assert g.ancestors("Module.net.fc.Linear.backward.0") == ["Module.net.Net.backward.0"]
    assert ("a", "Module.net.fc.Linear.backward.0") in search(DiffGraph(g), "fc backward")


def test_root_path_and_flow_path_chain_the_nodes_a_ui_highlights(diff):
    from probe.visualizer.navigate import flow_path, root_path

    g = diff.graph("a")
    side, node = first_divergence(diff)
    assert root_path(diff, side, node) == g.ancestors(node) + [node]
    head = "Module.head.Linear.forward.0"
    chain = flow_path(diff, "a", node, head)
    assert chain[0] == node and g.within(chain[-1], head)
    flow = {(e.src, e.dst) for e in g.flow()}
    assert all((s, t) in flow for s, t in zip(chain, chain[1:]))     # only real data-flow edges
    assert flow_path(diff, "a", head, node) == []                     # data never flows backwards


def test_groups_of_top_level_calls_face_the_group_holding_their_counterparts(tmp_path):
    import json

    for side in ("A", "B"):
        folder = tmp_path / side
        folder.mkdir()
        t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": -1.0,
             "Mean": 0.1, "Norm": 1.5}
        data = {"Functional.relu.0.forward": {"input_args": [t], "output": [t]},
                "Module.fc.Linear.forward.0": {"input_args": [t], "output": [t]},
                "Tensor.add.0.forward": {"input_args": [t], "output": [t]}}
        (folder / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "data": data}))
        (folder / "construct.json").write_text(json.dumps(dict.fromkeys(data)))
    ga, gb = Graph.load(tmp_path / "A"), Graph.load(tmp_path / "B")
    assert ga.roots() == ["Apis_Between_Modules.0", "Module.fc.Linear.forward.0", "Apis_Between_Modules.1"]
    d = DiffGraph(ga, gb, _by_name(ga, gb))
    assert d.counterpart("a", "Apis_Between_Modules.1") == "Apis_Between_Modules.1"
    assert d.state("a", "Apis_Between_Modules.0") == "none"
