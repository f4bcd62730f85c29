"""TorchStats: the native CPU kernel (serial and on torch's threads) and the byte-identity key."""

import math

import numpy as np
import pytest
import torch

from probe.engine_adapter import torch_stats
from probe.engine_adapter.base import FLOAT, INTEGER
from probe.engine_adapter.torch_stats import TorchStats


def expected(x: torch.Tensor) -> list[float]:
    a = x.double().numpy()
    nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    if nan:
        return [math.nan, math.nan, math.nan, math.nan, nan, inf]
    return [a.max(), a.min(), a.sum(), float((a * a).sum()), 0, inf]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 17, 63, 64, 65, 2047, 2049, 32767, 32768, 100_003, 300_000])
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_and_its_numpy_twin_give_the_same_statistics(dtype, monkeypatch):
    """The same six numbers with the kernel and without it (no compiler, ``PROBE_NATIVE=0``):
    max, min and the counts exactly, the sums to rounding (they add in another order)."""
    if not torch_stats._load_kernel():
        pytest.skip("no C compiler: the NumPy path is used")
    gen = torch.Generator().manual_seed(5)
    cases = [torch.randn(n, generator=gen, dtype=dtype) for n in (1, 7, 64, 4097, 100_003)]
    cases += [torch.randn(30, 40, generator=gen, dtype=dtype).t(), torch.full((5,), 1e20, dtype=dtype),
              torch.tensor([1.0, float("nan"), float("inf"), -2.0], dtype=dtype),
              torch.tensor([float("inf"), -float("inf"), 3.0], dtype=dtype)]
    native = [torch_stats._reduce_host(x, FLOAT) for x in cases]
    monkeypatch.setattr(torch_stats, "_kernel", False)
    twin = [torch_stats._reduce_host(x, FLOAT) for x in cases]
    for got, want in zip(native, twin):
        for i in (0, 1, 4, 5):
            assert got[i] == want[i] or (math.isnan(got[i]) and math.isnan(want[i])), (i, got, want)
        _same(got, want)


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


# -- the accelerator path (run on CPU tensors here; on the GPU where there is one) -------------

def _device_stats(x: torch.Tensor) -> list[float]:
    stats = TorchStats()
    return stats.gather([torch_stats._reduce_device(x, stats.describe(x).kind)])[0]


def _same(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if math.isnan(w):
            assert math.isnan(g)
        else:
            assert g == pytest.approx(w, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("chunk", [torch_stats.DEVICE_CHUNK, 7])
@pytest.mark.parametrize("case", ["normal", "huge", "nan", "infs", "half", "bfloat16", "int"])
def test_the_device_path_gives_the_host_paths_statistics(case, chunk, monkeypatch):
    """Over one chunk or many (chunk 7): the same six numbers as the host kernel, the sum and
    the sum of squares in float64 (values of 1e20: the sum of squares is 1e41, not inf)."""
    monkeypatch.setattr(torch_stats, "DEVICE_CHUNK", chunk)
    gen = torch.Generator().manual_seed(3)
    x = {"normal": lambda: torch.randn(1000, generator=gen),
         "huge": lambda: torch.tensor([1e20, -3e20, 2.0] * 10),
         "nan": lambda: torch.tensor([1.0, float("nan"), float("inf"), 2.0] * 5),
         "infs": lambda: torch.tensor([1.0, float("inf"), -float("inf"), float("inf")] * 5),
         "half": lambda: torch.randn(300, generator=gen).half(),
         "bfloat16": lambda: torch.randn(300, generator=gen).bfloat16(),
         "int": lambda: torch.arange(-50, 50, dtype=torch.int32)}[case]()
    got = _device_stats(x)
    _same(got, torch_stats._reduce_host(x, TorchStats().describe(x).kind))
    if case == "huge":
        assert got[3] == pytest.approx(1e42, rel=1e-6)
    if case in ("nan", "infs"):
        assert got[4:] == ([5.0, 5.0] if case == "nan" else [0.0, 15.0])


def test_a_device_handle_is_one_float64_tensor_that_gather_reads_with_the_others():
    stats = TorchStats()
    handles = [torch_stats._reduce_device(torch.arange(4.0), FLOAT),
               torch_stats._reduce_device(torch.arange(3, dtype=torch.int64), INTEGER),
               stats.reduce(torch.arange(4.0), FLOAT)]             # a host list beside them
    assert handles[0].dtype == torch.float64 and handles[0].shape == (6,)
    assert stats.gather(handles) == [[3.0, 0.0, 6.0, 14.0, 0.0, 0.0], [2.0, 0.0],
                                     [3.0, 0.0, 6.0, 14.0, 0.0, 0.0]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_statistics_on_the_gpu_are_the_hosts(dtype):
    stats = TorchStats()
    x = torch.randn(3_000_000, generator=torch.Generator().manual_seed(1)).to(dtype)
    x[17] = float("inf")
    got = stats.gather([stats.reduce(x.cuda(), FLOAT)])[0]
    _same(got, torch_stats._reduce_host(x, FLOAT))


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("n", [3, 40, 100_003])
def test_values_whose_squares_overflow_float32_give_a_finite_sum_of_squares(native, n, monkeypatch):
    """|x| = 1e20: x * x is 1e40, past float32's 3.4e38. The kernel's float lanes (and NumPy's
    float32 dot) overflowed to inf, so the dump's Norm read Infinity for a finite tensor (a
    diverging layer, just what the dump is for); the sums are taken again in double."""
    if not native:
        monkeypatch.setattr(torch_stats, "_kernel", False)
    elif not torch_stats._load_kernel():
        pytest.skip("no C compiler: the NumPy path is used")
    x = torch.full((n,), 1e20)
    x[0] = -3e20
    got = TorchStats().gather([TorchStats().reduce(x, FLOAT)])[0]
    want = expected(x)
    assert got[3] == pytest.approx(want[3], rel=1e-6) and math.isfinite(got[3])
    assert got[2] == pytest.approx(want[2], rel=1e-6)
    assert got[4:] == [0.0, 0.0]
