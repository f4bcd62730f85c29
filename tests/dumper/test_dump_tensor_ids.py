"""The dump's tensor ids: one id per distinct data in a step, from the tensor's identity, so the
graph's data-flow edges join the node that made a tensor to the nodes that took it, whatever ran
in between."""

from __future__ import annotations

import copy
import gc
import json

import pyarrow as pa
import torch
from torch import nn

from probe.engine_adapter.torch_stats import TorchStats
from probe.dumper.rows import ROW_COLUMNS, RowBuilder
from probe.dumper.session import DumpSession
from probe.visualizer.dataflow import TENSOR_ID, flow_edges
from probe.visualizer.graph import Graph


class Branches(nn.Module):
    """``c`` takes ``a``'s output (as a view) after ``b`` ran; ``b`` has ``a``'s weights, so its
    output has exactly the statistics of ``a``'s: only identity tells them apart. ``act`` is an
    in-place ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = copy.deepcopy(self.a)
        self.c = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.d = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        g = self.b(x)
        y = self.c(h.t().t().reshape(3, 4))
        return self.d(self.act(y)) + g


def _dump(tmp_path) -> Graph:
    torch.manual_seed(0)
    net = Branches()
    with DumpSession(net, out=str(tmp_path), level="module", auto_step=False, quiet=True):
        net(torch.randn(3, 4, requires_grad=True)).sum().backward()
    return Graph.load(tmp_path)


def _pairs(edges) -> set[tuple[str, str]]:
    return {(e.src.split(".")[1] + "." + e.src.split(".")[3], e.dst.split(".")[1] + "." + e.dst.split(".")[3])
            for e in edges}


def test_edges_follow_the_tensor_a_module_took_not_the_module_that_ran_before_it(tmp_path):
    g = _dump(tmp_path)
    flow = g.flow()
    # (d's input gradient is read where d's node hands it to act's output: the same tensor,
    # since the capture adds no identity node, so the backward mirrors act -> d too)
    assert _pairs(flow) == {("a.forward", "c.forward"), ("c.forward", "act.forward"),
                            ("act.forward", "d.forward"), ("c.backward", "a.backward"),
                            ("d.backward", "act.backward")}
    assert {e.via for e in flow} == {TENSOR_ID}
    # the statistics alone cannot tell a's output from b's (same weights, same input) and take
    # the producer that ran last: b; the recorded ids say a
    records = g._records
    unknown = records.set_column(records.schema.get_field_index(TENSOR_ID), TENSOR_ID,
                                 pa.nulls(records.num_rows, pa.int64()))
    by_stats = flow_edges(unknown, {n: node.parent for n, node in g.nodes.items()})
    assert ("b.forward", "c.forward") in _pairs(by_stats) and {e.via for e in by_stats} == {"statistics"}


def test_dump_json_and_the_store_carry_the_same_ids_and_an_in_place_change_gets_a_new_one(tmp_path):
    g = _dump(tmp_path)
    data = json.loads((tmp_path / "step0" / "rank0" / "dump.json").read_text())["data"]

    def tid(node, slot, i=0):
        return data[node][slot][i]["tensor_id"]
    a, c, act, d = ("Module.a.Linear.forward.0", "Module.c.Linear.forward.0",
                    "Module.act.ReLU.forward.0", "Module.d.Linear.forward.0")
    assert tid(a, "output") == tid(c, "input_args")          # a view (t().t().reshape) of a's output
    assert tid(a, "input_args") == tid("Module.b.Linear.forward.0", "input_args")   # one x for both
    assert tid(a, "output") != tid("Module.b.Linear.forward.0", "output")
    assert tid(act, "input_args") == tid(c, "output")
    assert tid(act, "output") != tid(act, "input_args")      # the same memory, changed in place
    assert tid(d, "input_args") == tid(act, "output")
    assert data[a]["parameters"]["weight"]["tensor_id"] >= 0
    # ids count from 0 in the order the step first read each tensor
    ids = sorted({t["tensor_id"] for e in data.values() for v in e.values()
                  for t in (v if isinstance(v, list) else v.values()) if isinstance(t, dict)})
    assert ids == list(range(len(ids)))
    # the store's records hold the same ids as dump.json's
    stored = {(r["node"], r["slot"], r["index"]): r[TENSOR_ID] for r in g._records.to_pylist()}
    assert stored[(c, "input", "0")] == tid(c, "input_args")
    assert stored[(act, "output", "0")] == tid(act, "output")


def test_a_view_keeps_the_id_an_in_place_change_and_new_data_get_new_ones():
    rows = RowBuilder(TorchStats(), want_hash=False, save=None, tensor_ids=True)

    def record(x, slot="input"):
        entry = rows.value(x, 0, "n", "api", "forward", slot, "0")
        return entry.get("tensor_id") if isinstance(entry, dict) else None
    t = torch.arange(12.0).reshape(3, 4)
    first = record(t)
    assert first == 0
    assert record(t.t()) == record(t.reshape(-1)) == record(t.view(2, 6)) == first
    assert record(t.t().contiguous()) == 1                   # a copy is other data
    assert record(t[1:]) == 2                                # a part of it is too
    t.add_(1)
    assert record(t) == 3 and record(t.t()) == 3             # a new version, and its views
    record(t.t())       # a view object dies right away; the storage lives on, so does the id
    gc.collect()
    assert record(t.reshape(12)) == 3
    assert record(2.5) is None and dict(zip(ROW_COLUMNS, rows.rows[-1]))[TENSOR_ID] is None
    assert [dict(zip(ROW_COLUMNS, r))[TENSOR_ID] for r in rows.rows[:3]] == [0, 0, 0]
    # memory freed and given to new data: a new id even at the same address
    x = torch.randn(1000)
    seen = record(x)
    del x
    gc.collect()
    assert record(torch.randn(1000)) != seen
    rows.start_step()
    assert record(t) == 0                                    # ids are per step
    off = RowBuilder(TorchStats(), want_hash=False, save=None)
    entry = off.value(t, 0, "n", "api", "forward", "input", "0")
    assert "tensor_id" not in entry and dict(zip(ROW_COLUMNS, off.rows[0]))[TENSOR_ID] is None
