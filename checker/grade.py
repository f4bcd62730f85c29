"""Grading one call: its measured output against the golden, under its :mod:`probe.checker.standards`.

The measures, over the finite elements of every floating output:

- ``max_abs_err``: the largest ``|measured - golden|``;
- ``max_rel_err``: the largest ``|measured - golden| / |golden|`` (elements above the dtype's
  smallest normal);
- ``max_ulp``: the largest error in units in the last place of the output dtype, at the
  larger of the golden value and the terms' magnitude;
- ``rel_err``: the error's norm over the golden's norm; ``cosine``: of measured and golden;
- ``balance``: ``sum((measured - golden) * sign(golden)) / sum(|measured - golden|)``, from -1
  (every error towards zero) to +1 (every error away from zero); rounding errors are unbiased
  (near 0), a wrong scale or a truncating kernel is not;
- ``budget_max`` / ``budget_mean``: the error over the standard's budget, per element, its
  largest and mean; ``over``: the share of elements beyond their budget.

Verdicts (the compare's vocabulary and ladder, :mod:`probe.compare.verdict`):

1. ``nan``: NaN or Inf where the golden has none (or the golden has some the output lacks);
2. ``error``: a shape, count or exact-value mismatch; or errors beyond the standard that are
   systematic: mean over budget above 1, more than :data:`ERROR_SHARE` of the elements beyond
   it, any element beyond :data:`ERROR_FACTOR` times it, or biased errors (``|balance|`` ≥
   :data:`BIASED`) on more than 1% of the elements;
3. ``warning``: some elements beyond the standard, the rest within it, errors unbiased;
4. ``pass``: every element within the standard.

The largest error over the budget is graded on the compare's ladder
(:func:`probe.compare.verdict.grade`) between 1 (the budget) and :data:`ERROR_FACTOR`; a
``warning`` whose errors are systematic is an ``error``.

>>> import torch
>>> from probe.checker.standards import standard
>>> g = torch.linspace(-1, 1, 101, dtype=torch.float64)
>>> grade([g.float()], [g], None, standard("Tensor.__add__", "torch.float32", 1)).verdict
'pass'
>>> r = grade([(g * 1.001).float()], [g], None, standard("Tensor.__add__", "torch.float32", 1))
>>> r.verdict, r.reason.split(";")[0]
('error', 'beyond the float32 standard for an elementwise op (1 ulp) on 100% of elements: max 16441x the budget, mean 12443x')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from probe.checker.standards import Standard, torch_dtype
from probe.compare.verdict import grade as ladder

#: more than this share of elements beyond their budget is an error
ERROR_SHARE = 0.05
#: an element beyond this many times its budget is an error
ERROR_FACTOR = 1000.0
#: errors this one-sided are systematic
BIASED = 0.5

METRICS = ("max_abs_err", "max_rel_err", "max_ulp", "rel_err", "cosine", "balance", "budget_max",
           "budget_mean", "over")


@dataclass
class Grade:
    """The verdict of one call, its reason in words, and its measures (None where not measured)."""

    verdict: str
    reason: str
    metrics: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(METRICS))


def grade(measured: Sequence[torch.Tensor | None], golden: Sequence[torch.Tensor | None],
          terms: Sequence[torch.Tensor | None] | None, std: Standard,
          input_dtype: str | None = None) -> Grade:
    """Grade the outputs ``measured`` of a call against ``golden`` (float64) under ``std``.

    ``terms``: the magnitude of each output's terms (the call on absolute inputs), or None.
    ``input_dtype``: the most precise floating dtype among the call's inputs, named in the
    reason when the output is less precise (the call computed in a lower precision).
    """
    if len(measured) != len(golden):
        return Grade("error", f"the replay returned {len(golden)} output(s), the dump holds {len(measured)}")
    acc = _Accumulator()
    for i, (m, g) in enumerate(zip(measured, golden)):
        if m is None or g is None:
            continue
        if tuple(m.shape) != tuple(g.shape):
            return Grade("error", f"output {i}: shape {list(m.shape)}, the golden's {list(g.shape)}")
        if not m.is_floating_point() or not g.is_floating_point() or std.op == "exact":
            if not _equal(m, g):
                n = int((m.to(g.dtype) != g).sum()) if m.numel() else 0
                return Grade("error", f"output {i}: {n} of {m.numel()} elements differ from the golden, "
                                      "which must match exactly")
            continue
        t = terms[i] if terms is not None and i < len(terms) else None
        bad = acc.add(m, g, t, std)
        if bad is not None:
            return Grade("nan", f"output {i}: {bad}", acc.metrics())
    metrics = acc.metrics()
    if acc.n == 0:
        return Grade("pass", "identical to the golden" if std.op == "exact" or not acc.seen
                     else "no finite elements to grade", metrics)
    lower = ""
    out_dt, in_dt = torch_dtype(std.dtype), torch_dtype(input_dtype or "")
    if out_dt is not None and in_dt is not None and torch.finfo(out_dt).eps > torch.finfo(in_dt).eps:
        lower = (f"; computed in {std.dtype.replace('torch.', '')} from "
                 f"{input_dtype.replace('torch.', '')} inputs")
    over, bmax, bmean, bal = metrics["over"], metrics["budget_max"], metrics["budget_mean"], metrics["balance"]
    of = " of the terms' magnitude" if acc.terms else ""
    stats = (f"max {_num(bmax)}x the budget, mean {_num(bmean)}x; max error {_num(metrics['max_ulp'])} ulp{of}, "
             f"relative {metrics['rel_err']:.1e}, cosine {metrics['cosine']:.6f}")
    bias = _bias_words(bal)
    verdict = ladder(bmax, 1.0, ERROR_FACTOR)
    if verdict == "pass":
        return Grade("pass", f"within {std.describe()}: max {_num(bmax)}x the budget; "
                             f"max error {_num(metrics['max_ulp'])} ulp{of}{lower}", metrics)
    share = f"{_pct(over)} of elements"
    if bmean > 1.0 or over > ERROR_SHARE or (abs(bal) >= BIASED and over > 0.01):
        verdict = "error"
    return Grade(verdict, f"beyond {std.describe()} on {share}: {stats}; {bias}{lower}", metrics)


class _Accumulator:
    """The measures of :func:`grade` over several outputs."""

    def __init__(self) -> None:
        self.n = 0
        self.seen = False
        self.terms = False
        self.max_abs = self.max_rel = self.max_ulp = 0.0
        self.err2 = self.gold2 = self.dot = self.meas2 = 0.0
        self.signed = self.abs_sum = 0.0
        self.bmax = self.bsum = 0.0
        self.over = 0

    def add(self, m: torch.Tensor, g: torch.Tensor, terms: torch.Tensor | None, std: Standard) -> str | None:
        """Add one output's measures (NumPy float64: a grade is a dozen passes over small
        arrays, where torch's per-op dispatch and threads cost more than the arithmetic)."""
        self.seen = True
        out_dt = torch_dtype(std.dtype) or m.dtype
        info = torch.finfo(out_dt)
        y = m.detach().to(torch.float64).reshape(-1).numpy()
        g = g.detach().to(torch.float64).reshape(-1).numpy()
        t = None if terms is None else np.abs(terms.detach().to(torch.float64).reshape(-1).numpy())
        if not (math.isfinite(float(y.sum())) and math.isfinite(float(g.sum()))):
            fy, fg = np.isfinite(y), np.isfinite(g)
            bad = int((fy & ~fg).sum()) + int((~fy & fg).sum())
            same = (y[~fg] == g[~fg]) | (np.isnan(y[~fg]) & np.isnan(g[~fg]))
            if bad or not bool(same.all()):
                return (f"{int((~fy).sum())} NaN/Inf element(s) in the output, {int((~fg).sum())} in the "
                        f"golden ({bad} where only one side has them)")
            y, g = y[fy], g[fy]
            t = None if t is None else t[fy]
        if y.size == 0:
            return None
        err = np.abs(y - g)
        mag = np.abs(g)
        gold2 = _dot(g, g)
        scale = mag if t is None else np.maximum(mag, t)
        if std.k > 1 or t is not None:
            self.terms = True
            if t is None:
                scale = np.maximum(scale, math.sqrt(gold2 / g.size))
        budget = std.c_out * _ulp(mag, info) + std.acc * scale
        np.maximum(budget, info.tiny, out=budget)
        ratio = err / budget
        big = mag > info.tiny
        self.n += y.size
        self.max_abs = max(self.max_abs, float(err.max()))
        self.max_rel = max(self.max_rel, float((err[big] / mag[big]).max()) if big.any() else 0.0)
        self.max_ulp = max(self.max_ulp, float((err / _ulp(scale, info)).max()))
        self.err2 += _dot(err, err)
        self.gold2 += gold2
        self.meas2 += _dot(y, y)
        self.dot += _dot(y, g)
        self.signed += _dot(y - g, np.sign(g))
        self.abs_sum += float(err.sum())
        self.bmax = max(self.bmax, float(ratio.max()))
        self.bsum += float(ratio.sum())
        self.over += int(np.count_nonzero(ratio > 1.0))
        return None

    def metrics(self) -> dict[str, float | None]:
        if self.n == 0:
            return dict.fromkeys(METRICS)
        denom = math.sqrt(self.gold2 * self.meas2)
        return {
            "max_abs_err": self.max_abs, "max_rel_err": self.max_rel, "max_ulp": self.max_ulp,
            "rel_err": math.sqrt(self.err2 / self.gold2) if self.gold2 > 0 else (0.0 if self.err2 == 0 else math.inf),
            "cosine": self.dot / denom if denom > 0 else (1.0 if self.err2 == 0 else 0.0),
            "balance": self.signed / self.abs_sum if self.abs_sum > 0 else 0.0,
            "budget_max": self.bmax, "budget_mean": self.bsum / self.n, "over": self.over / self.n,
        }


def _ulp(x: np.ndarray, info: torch.finfo) -> np.ndarray:
    """The unit in the last place of the dtype described by ``info`` at each value of ``x``
    (:func:`probe.checker.standards.ulp` in NumPy, from the float64 exponent bits: integer passes).

    >>> _ulp(np.array([1.0, 3.0, 0.0]), torch.finfo(torch.bfloat16)).tolist()[:2]
    [0.0078125, 0.015625]
    """
    shift = int(round(math.log2(info.eps)))
    bits = np.maximum(x, info.tiny).view(np.int64) >> 52
    bits += shift
    bits <<= 52
    return bits.view(np.float64)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a · b`` without BLAS (whose threads spin against the training's on a busy host)."""
    return float(np.multiply(a, b).sum())


def _equal(m: torch.Tensor, g: torch.Tensor) -> bool:
    """Bit-for-bit agreement (NaN matching NaN); the golden of an exact op is the measured
    value in a wider dtype, so the cheap test is the golden cast back."""
    if torch.equal(m, g.to(m.dtype)):
        return True
    if m.dtype != g.dtype and (m.is_floating_point() or g.is_floating_point()):
        a, b = m.to(torch.float64), g.to(torch.float64)
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(m, g.to(m.dtype)))


def _bias_words(balance: float) -> str:
    if balance >= BIASED:
        return f"errors biased away from zero (balance {balance:+.2f})"
    if balance <= -BIASED:
        return f"errors biased towards zero (balance {balance:+.2f})"
    return f"errors unbiased (balance {balance:+.2f})"


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.2g}" if v < 10 else f"{v:.1f}"


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%" if v >= 0.01 else f"{v * 100:.2g}%"
