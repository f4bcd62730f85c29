"""Data-flow edges: from the tensor that one node outputs and another takes in, never from order."""

import pyarrow as pa

from probe.collectors.records import table_from_rows
from probe.visualizer.dataflow import flow_edges

X = dict(dtype="float32", shape=[2, 3], max=2.0, min=-1.0, mean=0.5, l2norm=2.25)
Y = dict(dtype="float32", shape=[2, 3], max=4.0, min=-2.0, mean=1.0, l2norm=4.5)
ZEROS = dict(dtype="float32", shape=[2, 3], max=0.0, min=0.0, mean=0.0, l2norm=0.0)


def rows(*specs):
    return table_from_rows("tensor", [dict(stats, node=node, slot=slot, seq=seq, index="0")
                                      for node, slot, seq, stats in specs])


def pairs(edges):
    return [(e.src, e.dst) for e in edges]


def test_an_output_taken_as_a_later_input_is_an_edge_and_unrelated_nodes_get_none():
    t = rows(("a", "output", 0, X), ("b", "input", 1, X), ("b", "output", 1, Y), ("c", "input", 2, ZEROS))
    edges = flow_edges(t, dict.fromkeys("abc"))
    assert pairs(edges) == [("a", "b")] and edges[0].via == "statistics"


def test_constant_and_non_finite_tensors_make_no_edge():
    nan = dict(X, max=float("nan"), min=float("nan"))
    t = rows(("a", "output", 0, ZEROS), ("b", "input", 1, ZEROS), ("c", "output", 2, nan), ("d", "input", 3, nan))
    assert flow_edges(t, dict.fromkeys("abcd")) == []


def test_the_consumer_is_fed_by_the_latest_producer_of_the_same_data():
    # b is an identity operation (view): its output has a's statistics; c reads after b
    t = rows(("a", "output", 0, X), ("b", "input", 1, X), ("b", "output", 1, X), ("c", "input", 2, X))
    assert pairs(flow_edges(t, dict.fromkeys("abc"))) == [("a", "b"), ("b", "c")]


def test_edges_join_the_deepest_nodes_and_skip_a_module_handing_on_its_childs_tensor():
    # module M (seq 2, after its children) takes X in and gives Y out through its child m1
    parent = {"p": None, "M": None, "m1": "M", "q": None}
    t = rows(("p", "output", 0, X), ("m1", "input", 1, X), ("m1", "output", 1, Y),
             ("M", "input", 2, X), ("M", "output", 2, Y), ("q", "input", 3, Y))
    assert pairs(flow_edges(t, parent)) == [("p", "m1"), ("m1", "q")]


def test_a_recorded_tensor_id_is_the_identity_when_present():
    t = rows(("a", "output", 0, X), ("b", "input", 1, Y), ("c", "input", 2, X))
    t = t.set_column(t.schema.get_field_index("tensor_id"), "tensor_id", pa.array([7, 7, None], pa.int64()))
    edges = flow_edges(t, dict.fromkeys("abc"))
    assert pairs(edges) == [("a", "b")] and edges[0].via == "tensor_id"
