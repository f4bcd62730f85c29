"""The web's graph of a dump of the bundled engine draws its data-flow edges from the tensor ids
the dump recorded, read from dump.json or from the store alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from probe.engine.config import get_preset
from probe.engine.data import make_batch
from probe.engine.models import build_model, init_reference_state
from probe.dumper.session import DumpSession
from probe.visualizer.dataflow import TENSOR_ID
from probe.visualizer.diff import DiffGraph
from probe.visualizer.graph import Graph


@pytest.fixture(scope="module")
def engine_dump(tmp_path_factory):
    torch.manual_seed(0)
    cfg = get_preset("tiny")
    model = build_model("reference", cfg)
    model.load_reference_state(init_reference_state(cfg, 0))
    tokens, targets = make_batch(cfg, 0, 0, 1, 0, None)
    out = tmp_path_factory.mktemp("engine-dump")
    with DumpSession(model, out=str(out), level="mix", auto_step=False, quiet=True):
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    return out


def test_the_web_graph_of_the_bundled_engine_has_its_edges_from_tensor_ids(engine_dump):
    web = DiffGraph.from_dumps(engine_dump, None, None).graph("a")     # what the graph page draws
    flow = web.flow()
    assert len(flow) > 50 and {e.via for e in flow} == {TENSOR_ID}
    pairs = {(e.src, e.dst) for e in flow}
    from_json = Graph.load(engine_dump / "step0" / "rank0" / "dump.json").flow()
    from_store = Graph.load(engine_dump).flow()
    assert {(e.src, e.dst, e.via) for e in from_json} == {(e.src, e.dst, e.via) for e in from_store}
    assert pairs == {(e.src, e.dst) for e in from_json}
    # the embedding's output feeds the first block's norm and, long after the attention ran
    # in between, its residual add: data flow, not execution order
    block, norm = "Module.layers.0.Block.forward.0", "Module.layers.0.input_norm.RMSNorm.forward.0"
    embed = [e.dst for e in flow if e.src == "Functional.embedding.0.forward"]
    assert all(web.within(d, block) for d in embed) and any(web.within(d, norm) for d in embed)
    residual = [d for d in embed if not web.within(d, norm)]
    attn = "Module.layers.0.attn.Attention.forward.0"
    assert residual and all(web.nodes[d].order > web.nodes[attn].order for d in residual)
    for proj in ("q_proj", "k_proj", "v_proj"):
        linear = web.children(f"Module.layers.0.attn.{proj}.Linear.forward.0")
        assert any(web.within(src, norm) and dst in linear for src, dst in pairs), proj
