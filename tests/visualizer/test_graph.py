import json
import math

import pytest

from probe.ground.errors import ProbeError
from probe.visualizer.graph import Graph, parse_name


def test_module_tree_nests_children_under_their_construct_parent_in_execution_order(msprobe_data):
    g = Graph.load(msprobe_data / "torch_llama_mix")
    block = "Module.layers.0.Block.forward.0"
    assert g.roots()[:2] == ["Module.embed.Embedding.forward.0", block]
    kids = g.children(block)
    assert kids[0] == "Module.layers.0.input_norm.RMSNorm.forward.0"
    assert kids.index("Module.layers.0.attn.Attention.forward.0") < kids.index("Module.layers.0.mlp.MLP.forward.0")
    assert g.ancestors("Functional.linear.0.forward") == [
        block, "Module.layers.0.attn.Attention.forward.0", "Module.layers.0.attn.q_proj.Linear.forward.0"]


def test_node_statistics_cover_inputs_outputs_parameters_and_parameter_grads(msprobe_data):
    g = Graph.load(msprobe_data / "torch_L0")
    fwd = g.tensors("Module.embed.Linear.forward.0")
    assert {t.slot for t in fwd} == {"input", "output", "parameter"}
    weight = next(t for t in fwd if t.slot == "parameter" and t.index == "weight")
    assert weight.shape == (32, 16) and weight.norm > 0
    bwd = g.tensors("Module.embed.Linear.backward.0")
    assert {t.index for t in bwd if t.slot == "parameter_grad"} == {"weight", "bias"}


def test_data_flow_edges_follow_an_output_into_the_node_that_consumes_it(msprobe_data):
    g = Graph.load(msprobe_data / "torch_llama_mix")
    flow = g.flow()
    norm, attn = "Module.layers.0.input_norm.RMSNorm.forward.0", "Module.layers.0.attn.Attention.forward.0"
    into_attn = [e for e in flow if g.within(e.dst, attn) and not g.within(e.src, attn)]
    assert into_attn and all(g.within(e.src, norm) for e in into_attn)
    # every edge joins two nodes that hold the same tensor: an output and a later input
    def same(t):
        return (t.dtype, math.prod(t.shape or ()), t.max, t.min, t.mean, t.norm)
    for e in flow:
        out = {same(t) for t in g.tensors(e.src) if t.slot == "output"}
        assert out & {same(t) for t in g.tensors(e.dst) if t.slot in ("input", "kwarg")}, e


def test_a_node_fed_by_no_recorded_tensor_has_no_incoming_edge(msprobe_data):
    g = Graph.load(msprobe_data / "torch_llama_mix")
    first = g.walk()[0]
    assert not [e for e in g.flow() if e.dst == first] and g.neighbours(first)[0] == []


def test_top_level_api_calls_between_modules_are_grouped_and_modules_stay_on_top(msprobe_data):
    g = Graph.load(msprobe_data / "torch_llama_mix")
    groups = [r for r in g.roots() if g.nodes[r].kind == "group"]
    assert groups and all(g.nodes[r].kind in ("module", "group") for r in g.roots())
    members = g.children(groups[0])
    assert members and all(g.nodes[m].kind != "module" and g.nodes[m].parent == groups[0] for m in members)
    assert g.ancestors(members[0]) == [groups[0]]
    assert g.nodes[groups[0]].label == f"{groups[0]} ({len(members)} calls)"
    assert sorted(g.walk()) == sorted(g)


def test_stack_and_mindspore_cells_are_read(msprobe_data):
    g = Graph.load(msprobe_data / "mindspore_L0")
    assert g.roots()[0] == "Cell.embed.Dense.forward.0"
    assert g.nodes["Cell.embed.Dense.forward.0"].label == "embed (Dense) fwd"
    assert any("cell.py" in line for line in g.stack("Cell.embed.Dense.forward.0"))


def test_a_dump_without_construct_lists_every_api_at_top_level(msprobe_data):
    g = Graph.load(msprobe_data / "torch_llama_md5_L1")
    assert len(g.roots()) == len(g) and g.roots()[0] == "Functional.embedding.0.forward"


def test_names_split_into_kind_direction_class_and_path():
    assert parse_name("Cell.block.attn.q.Dense.backward.0") == ("module", "backward", "Dense", "block.attn.q")
    assert parse_name("Primitive.reshape.Reshape.15.backward")[:3] == ("api", "backward", "Reshape")


def test_bad_dump_paths_raise_one_line_errors(tmp_path):
    with pytest.raises(ProbeError, match="no such dump"):
        Graph.load(tmp_path / "missing")
    (tmp_path / "dump.json").write_text("{not json")
    with pytest.raises(ProbeError, match="malformed JSON"):
        Graph.load(tmp_path)
    (tmp_path / "dump.json").write_text("[]")
    with pytest.raises(ProbeError, match="not an msprobe dump.json"):
        Graph.load(tmp_path)


def test_neighbours_are_the_siblings_feeding_and_fed_by_a_node(msprobe_data):
    g = Graph.load(msprobe_data / "torch_llama_mix")
    ins, outs = g.neighbours("Module.layers.0.attn.Attention.forward.0")
    assert ins == ["Module.layers.0.input_norm.RMSNorm.forward.0"] and outs == ["Tensor.__add__.4.forward"]


def test_a_run_directory_store_gives_the_same_graph_as_its_msprobe_dump(msprobe_data, tmp_path):
    from probe.collectors.msprobe_reader import read_msprobe_dump
    from probe.collectors.store import StoreWriter

    dump = read_msprobe_dump(msprobe_data / "torch_llama_mix" / "step0" / "proc0" / "dump.json")
    with StoreWriter(tmp_path, rank=0) as w:
        w.write("tensor", dump.tensors)
        w.write("node", dump.nodes)
    from_dump, from_store = Graph.load(msprobe_data / "torch_llama_mix"), Graph.load(tmp_path)
    assert from_store.walk() == from_dump.walk()
    name = "Module.layers.0.attn.Attention.forward.0"
    assert from_store.tensors(name) == from_dump.tensors(name)
    assert from_store.neighbours(name) == from_dump.neighbours(name)


def test_step_and_rank_choose_among_the_dumps_of_a_root(tmp_path):
    entry = {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1],
                             "Max": 1.0, "Min": 1.0, "Mean": 1.0, "Norm": 1.0}]}
    for step, rank, api in ((0, 0, "relu"), (1, 0, "gelu"), (1, 1, "silu")):
        folder = tmp_path / f"step{step}" / f"rank{rank}"
        folder.mkdir(parents=True)
        (folder / "dump.json").write_text(json.dumps({"data": {f"Functional.{api}.0.forward": entry}}))
    assert Graph.load(tmp_path).roots() == ["Functional.relu.0.forward"]
    assert Graph.load(tmp_path, step=1).roots() == ["Functional.gelu.0.forward"]
    assert Graph.load(tmp_path, step=1, rank=1).roots() == ["Functional.silu.0.forward"]
    with pytest.raises(ProbeError, match="no dump of step 2"):
        Graph.load(tmp_path, step=2)
