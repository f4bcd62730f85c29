"""Level 3: op times on a device, collectives from their sizes, and a step's composition."""

from __future__ import annotations

import pytest

from probe.simulator.collectives import comm_seconds
from probe.simulator.devices import get_device
from probe.simulator.engine_workload import trace_engine
from probe.simulator.layout import make_layout
from probe.simulator.simulation import simulate


def test_a_ring_all_reduce_moves_twice_the_bytes_over_the_slowest_link():
    h100 = get_device("H100")
    inside = comm_seconds("all_reduce", 10**9, 8, h100, crosses_nodes=False)
    across = comm_seconds("all_reduce", 10**9, 8, h100, crosses_nodes=True)
    assert inside == pytest.approx(2 * 7 / 8 * 1e9 / 450e9 + 6 * 10e-6)
    assert across == pytest.approx(2 * 7 / 8 * 1e9 / 50e9 + 6 * 10e-6)


def test_data_parallel_sync_grows_the_step_and_zero3_gathers_more():
    times = {}
    for nproc, zero in ((1, 0), (64, 0), (64, 3)):
        lay = make_layout(nproc=nproc, zero=zero, global_batch=64)
        times[(nproc, zero)] = simulate(trace_engine("mini", "reference", "float32", lay), lay,
                                        level=3, device="A100").times["A100"]
    assert times[(1, 0)]["comm_s"] == 0
    assert times[(64, 0)]["exposed_comm_s"] > 0
    # reduce-scatter + three all-gathers of shards move twice an all-reduce's bytes, in 4 latencies
    assert times[(64, 3)]["comm_s"] > 2 * times[(64, 0)]["comm_s"]


def test_a_pipeline_step_is_its_stages_plus_the_bubble():
    lay = make_layout(nproc=2, pp=2, global_batch=8)               # dp 1, 8 microbatches of 1
    ranks = simulate(trace_engine("mini", "reference", "bfloat16", lay), lay, level=3, device="H100")
    step = ranks.times["H100"]
    fb = [s["microbatch_s"] for s in step["stages"]]
    after = max(s["after_s"] for s in step["stages"])
    # 1F1B over two stages and eight microbatches: fill and drain through both, seven more
    # forward-backward slots of the slower stage, then the optimizer
    assert step["step_time_s"] == pytest.approx(sum(fb) + 7 * max(fb) + after)
    assert step["pipeline_bubble_s"] == pytest.approx(min(fb))
    assert 0 < step["mfu"] < 1
    assert lay.microbatches == 8
