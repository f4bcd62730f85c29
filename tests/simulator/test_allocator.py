"""Level 2: the CUDA caching allocator's rules and the kernels' own workspaces."""

from __future__ import annotations

import torch

from probe.simulator.allocator import CachingAllocator, serve
from probe.simulator.fake_run import FakeRun
from probe.simulator.memory import timeline

MiB = 2**20


def test_small_requests_round_to_512_bytes_inside_2_mib_segments():
    a = CachingAllocator()
    blocks = [a.malloc(n) for n in (1, 513, 1000)]
    assert [b.size for b in blocks] == [512, 1024, 1024]
    assert a.allocated == 2560 and a.reserved == 2 * MiB


def test_large_requests_take_20_mib_segments_below_10_mib_and_round_to_2_mib_above():
    a = CachingAllocator()
    a.malloc(3 * MiB)
    assert a.reserved == 20 * MiB
    b = CachingAllocator()
    b.malloc(11 * MiB + 1)
    assert b.reserved == 12 * MiB


def test_freed_blocks_are_cached_reused_best_fit_and_merged():
    a = CachingAllocator()
    x, y = a.malloc(4 * MiB), a.malloc(4 * MiB)
    a.free(x)
    a.free(y)
    assert a.allocated == 0 and a.reserved == 20 * MiB        # kept, not given back
    z = a.malloc(8 * MiB)                                     # x and y merged back into one
    assert a.reserved == 20 * MiB and z.size == 8 * MiB


def test_a_bool_count_on_cpu_takes_an_int64_copy_of_its_input_as_workspace():
    with FakeRun() as run:
        mask = torch.ones(1 << 20, dtype=torch.bool)
        mask.sum()
    trace = run.tracer.trace
    plain = serve(trace, caching=False, cuda_rules=False)
    assert timeline(trace).peak == (1 << 20) + 8
    assert plain.peak_allocated == (1 << 20) + 8 + 8 * (1 << 20)


def test_cuda_adds_the_blas_workspace_at_the_first_matmul():
    with FakeRun() as run:
        a = torch.ones(64, 64)
        a @ a
    series = serve(run.tracer.trace, caching=True, cuda_rules=True, blas_workspace=32 * MiB)
    assert series.peak_allocated == 32 * MiB + 2 * 16384
