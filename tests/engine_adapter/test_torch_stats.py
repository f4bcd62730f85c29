"""TorchStats: the native CPU kernel (serial and on torch's threads) and the byte-identity key."""

import math

import numpy as np
import pytest
import torch

from engine_adapter import torch_stats
from engine_adapter.torch_stats import TorchStats


def expected(x: torch.Tensor) -> list[float]:
    a = x.double().numpy()
    nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    if nan:
        return [math.nan, math.nan, math.nan, math.nan, nan, inf]
    return [a.max(), a.min(), a.sum(), float((a * a).sum()), 0, inf]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 17, 32767, 32768, 100_003, 300_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_native_kernel_gives_numpys_statistics_serial_and_on_torchs_threads(threads, n, dtype):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        stats = TorchStats()
        gen = torch.Generator().manual_seed(n)
        for case in ("finite", "inf late", "nan late"):
            x = torch.randn(n, generator=gen, dtype=dtype)
            if case == "inf late":
                x[-1] = float("inf")           # in the last thread's share
            elif case == "nan late":
                x[n // 2] = float("nan")
            got = stats.gather([stats.reduce(x, stats.describe(x).kind)])[0]
            want = expected(x)
            assert got[4:] == want[4:], case
            if case == "nan late":
                assert math.isnan(got[0]) and math.isnan(got[1]), case
            else:
                assert got[0] == want[0] and got[1] == want[1], case
            if case == "finite":
                assert got[2] == pytest.approx(want[2], rel=1e-6, abs=1e-6 * math.sqrt(want[3]))
                assert got[3] == pytest.approx(want[3], rel=1e-6)
    finally:
        torch.set_num_threads(before)


def test_the_kernel_is_built_and_shares_torchs_openmp_runtime_when_torch_has_one():
    if not torch_stats._load_kernel():
        pytest.skip("no C compiler: the NumPy path is used")
    with open("/proc/self/maps") as f:
        gomps = {line.rsplit(None, 1)[-1] for line in f if "libgomp" in line}
    assert len(gomps) <= 1, gomps          # never a second OpenMP runtime beside torch's


def test_views_of_the_same_bytes_share_a_key_and_other_bytes_do_not():
    stats = TorchStats()
    x = torch.randn(4, 6)
    key = stats.identity(x)
    assert stats.identity(x.t()) == key and stats.identity(x.view(24)) == key
    assert stats.identity(x[:2]) != key                 # fewer elements
    assert stats.identity(x[:, ::2]) != key             # a strided view reads other bytes
    before = stats.identity(x)
    x.add_(1)
    assert stats.identity(x) != before                  # an in-place change is new data
