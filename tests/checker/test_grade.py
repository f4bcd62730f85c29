"""The standard and the grade of one call: what passes, what is a warning, an error, a NaN."""

from __future__ import annotations

import torch

from probe.checker.grade import grade
from probe.checker.standards import standard, ulp


def _g(n: int = 4096, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_correctly_rounded_output_passes_in_every_dtype():
    g = _g()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        r = grade([g.to(dtype)], [g], None, standard("Tensor.__add__", str(dtype), 1))
        assert r.verdict == "pass", (dtype, r.reason)
        assert r.metrics["max_ulp"] <= 0.5 and abs(r.metrics["balance"]) < 0.1


def test_a_long_bf16_matmul_is_allowed_more_error_than_an_fp32_add():
    long_mm = standard("Functional.linear", "torch.bfloat16", 4096)
    add = standard("Tensor.__add__", "torch.float32", 1)
    g = torch.tensor([1.0], dtype=torch.float64)
    budget = lambda s: s.c_out * float(ulp(g, getattr(torch, s.dtype[6:]))) + s.acc * 1.0  # noqa: E731
    assert budget(long_mm) > 1000 * budget(add)
    assert standard("Functional.linear", "torch.float32", 4096).acc > standard("Functional.linear", "torch.float32", 64).acc


def test_a_relative_1e_3_scaling_is_an_error_with_biased_errors_in_words():
    g = _g()
    r = grade([(g * 1.001).float()], [g], None, standard("Functional.linear", "torch.float32", 64))
    assert r.verdict == "error"
    assert "biased away from zero" in r.reason and r.metrics["balance"] > 0.99
    assert abs(r.metrics["rel_err"] - 1e-3) < 1e-5 and r.metrics["over"] > 0.9


def test_a_few_elements_beyond_the_standard_is_a_warning_and_many_an_error():
    g = _g()
    few = g.float().clone()
    few[:8] = few[:8] * (1 + 2e-6) + torch.tensor([1e-6, -1e-6] * 4)   # 8 of 4096, unbiased
    r = grade([few], [g], None, standard("Tensor.__add__", "torch.float32", 1))
    assert r.verdict == "warning", r.reason
    assert r.metrics["over"] < 0.01 and "unbiased" in r.reason
    many = g.float() + torch.where(torch.arange(4096) % 2 == 0, 1, -1) * g.float().abs() * 3e-6
    assert grade([many], [g], None, standard("Tensor.__add__", "torch.float32", 1)).verdict == "error"


def test_cancellation_is_graded_against_the_terms_magnitude():
    # a dot product whose exact result is near zero: the output's own ulp is tiny, the terms' is not
    g = torch.cat([torch.tensor([1e-9]), torch.full((99,), 1e-3)]).double()
    measured = g.float()
    measured[0] += 3e-7
    terms = torch.full((100,), 64.0, dtype=torch.float64)
    std = standard("Functional.linear", "torch.float32", 64)
    assert grade([measured], [g], [terms], std).verdict == "pass"
    assert grade([measured], [g], None, std).verdict != "pass"


def test_nan_where_the_golden_is_finite_is_its_own_verdict_and_matching_infs_are_not():
    g = _g(16)
    bad = g.float().clone()
    bad[3] = float("nan")
    r = grade([bad], [g], None, standard("Torch.exp", "torch.float32", 1))
    assert r.verdict == "nan" and "1 NaN/Inf" in r.reason
    g2 = g.clone()
    g2[0] = float("-inf")
    ok = g2.float()
    assert grade([ok], [g2], None, standard("Tensor.__add__", "torch.float32", 1)).verdict == "pass"


def test_exact_operations_must_match_bit_for_bit_and_shapes_must_agree():
    g = torch.arange(10, dtype=torch.int64)
    off = g.clone()
    off[2] = 7
    r = grade([off], [g], None, standard("Tensor.__getitem__", "torch.int64", 1))
    assert r.verdict == "error" and "1 of 10 elements differ" in r.reason
    r = grade([torch.zeros(3)], [torch.zeros(4, dtype=torch.float64)], None,
              standard("Tensor.__add__", "torch.float32", 1))
    assert r.verdict == "error" and "shape" in r.reason
    r = grade([torch.zeros(3)], [], None, standard("Tensor.__add__", "torch.float32", 1))
    assert r.verdict == "error" and "output(s)" in r.reason


def test_an_output_less_precise_than_its_inputs_says_so():
    g = _g()
    r = grade([g.bfloat16()], [g], None, standard("Functional.linear", "torch.bfloat16", 64), "torch.float32")
    assert "computed in bfloat16 from float32 inputs" in r.reason
