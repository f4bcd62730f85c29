"""The precision standard of one API call: how much error its output may carry, per element.

A call is graded against the exact result of its own recorded inputs (the golden, computed in
float64). A correct kernel's output differs from it by two things only, and the standard allows
each, with constants per class of operation (:data:`CLASSES`; the class of an API is
:func:`probe.checker.apis.op_class`):

1. **Rounding of the output** to its dtype: ``c_out`` units in the last place of the output
   dtype at the golden value (:func:`ulp`).
2. **Error relative to the terms' magnitude** ``S``: ``c_acc · u_acc · L · S``, where ``u_acc``
   is the unit roundoff of the precision a kernel is expected to compute in (float32 for
   float32, bfloat16 and float16 outputs: every current kernel accumulates those in float32;
   float64 for float64) and ``L`` the length that grows the error:

   - a reduction or matmul of ``K`` terms: ``L = sqrt(K)`` and ``S`` the magnitude of the terms
     (the classic bound of a sum's rounding error, which keeps an output near zero by
     cancellation from looking wrong): for a matrix product the product of the row and column
     norms (Cauchy-Schwarz), for other sums of the inputs (sum, mean, conv) the same call on the
     inputs' absolute values, else the output's own magnitude, floored at its root mean square;
   - an attention (``softmax(q·kᵀ·s)·v``, with or without the projections of a multi-head
     attention): ``L = sqrt(K) + Λ``, ``K`` the lengths of its products and softmax added up and
     ``Λ`` a bound on the largest logit ``|q·k·s|``: a logit's own rounding error, ``u·|logit|``,
     becomes a relative error of its softmax weight; ``S`` the output's magnitude floored at its
     root mean square;
   - an activation ``x·(1 + f(x))/2`` (gelu with erf or tanh) or ``x - f(x)``: ``L = 1`` and
     ``S = |x|``: ``f`` is computed to a few units of 1, not of ``1 + f`` near -1.

So a bfloat16 matmul over 4096 terms is allowed far more error than a float32 add, and an
operation that lost more precision than its dtype and length explain (it computed in bfloat16
what it was handed in float32, as autocast does; it accumulated in bfloat16; it is a wrong
kernel) is beyond the standard.

>>> s = standard("Functional.linear", "torch.bfloat16", 4096)
>>> s.op, s.c_out, round(s.acc, 10) > 0
('matmul', 2.0, True)
>>> standard("Tensor.__add__", "torch.float32", 1).acc
0.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from probe.checker.apis import op_class



@dataclass(frozen=True)
class OpClass:
    """The budget of one class of operation: ``c_out`` ulp of output rounding, ``c_acc`` the
    constant of the error relative to the terms' magnitude (module docstring), and why."""

    c_out: float
    c_acc: float
    why: str


#: every class's budget, and why (docs/check-api.md shows this table). The constants are
#: calibrated on float32 CPU kernels (PyTorch 2.x, `tests/checker/test_op_classes.py`): the
#: largest error of a correct call is under half its budget, a bfloat16 computation of it
#: is far beyond.
CLASSES: dict[str, OpClass] = {
    "exact": OpClass(0.0, 0.0, "copies, layout, indexing, selections, comparisons, integer results"),
    "elementwise": OpClass(1.0, 0.0, "one IEEE-rounded operation (add, mul, div): 0.5 ulp when "
                                     "correctly rounded, 1 allows a faithful rounding"),
    "transcendental": OpClass(4.0, 0.0, "vectorised libm (Sleef: 1.0-3.5 ulp; exp, log, tanh, sigmoid, "
                                        "silu, pow, rsqrt) or two or three chained roundings"),
    "activation": OpClass(4.0, 16.0, "gelu = x(1 + erf(x/sqrt 2))/2 (or tanh): erf is good to a few u "
                                     "of 1, not of 1 + erf near -1; measured up to 6.4 u|x|"),
    "reduction": OpClass(2.0, 4.0, "rounded once after a float32 accumulation of K terms: "
                                   "error about u sqrt(K) of the terms' magnitude"),
    "matmul": OpClass(2.0, 4.0, "K products accumulated in float32 (linear, bmm, baddbmm, conv)"),
    "attention": OpClass(2.0, 8.0, "three chained products and a softmax (sdpa, multi-head attention): "
                                   "the stages' lengths plus the largest logit, relative to the output's RMS; "
                                   "measured up to 1.5 u (sqrt K + logit) RMS"),
}

_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
for _n in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _n):
        _DTYPES[f"torch.{_n}"] = getattr(torch, _n)


@dataclass(frozen=True)
class Standard:
    """What the output of one call may carry: see the module docstring."""

    op: str           # a class of CLASSES
    dtype: str        # the output dtype, as the dump writes it ("torch.bfloat16")
    k: int            # terms per output element (1: elementwise)
    c_out: float      # output rounding allowance, units in the last place
    acc: float        # allowance relative to the terms' magnitude (c_acc · u_acc · L)
    logit: float = 0.0  # an attention's largest logit bound (Λ)

    def describe(self) -> str:
        """The standard in words.

        >>> standard("Functional.linear", "torch.bfloat16", 4096).describe()
        'the bfloat16 standard for a 4096-term matmul (2 ulp + float32 accumulation)'
        """
        short = self.dtype.replace("torch.", "")
        what = f"{self.k}-term {self.op}" if self.k > 1 else f"{self.op} op"
        article = "an" if what[0] in "aeiou8" else "a"
        allowed = f"{self.c_out:g} ulp"
        if self.acc:
            acc = "float64" if self.dtype == "torch.float64" else "float32"
            if self.op == "activation":
                allowed += f" + {CLASSES[self.op].c_acc:g} {acc} u·|x|"
            elif self.logit:
                allowed += f" + {acc} accumulation, largest logit {self.logit:.3g}"
            else:
                allowed += f" + {acc} accumulation"
        return f"the {short} standard for {article} {what} ({allowed})"


def torch_dtype(name: str) -> torch.dtype | None:
    """The floating torch dtype of a dump's dtype text, or None (integers, bools, unknown)."""
    return _DTYPES.get(name if name.startswith("torch.") else f"torch.{name}")


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1 to the next value of ``dtype``.

    >>> unit_roundoff(torch.float32) == 2.0 ** -24, unit_roundoff(torch.bfloat16) == 2.0 ** -8
    (True, True)
    """
    return torch.finfo(dtype).eps / 2


def standard(api: str, dtype: str, k: int, logit: float = 0.0) -> Standard:
    """The standard of a call of ``api`` whose output has ``dtype`` and sums ``k`` terms
    (``logit``: an attention's largest logit bound).

    >>> s = standard("Functional.gelu", "torch.float32", 1)
    >>> s.op, s.c_out, s.acc == 16 * 2.0 ** -24
    ('activation', 4.0, True)
    """
    op = op_class(api)
    dt = torch_dtype(dtype)
    if dt is None:
        return Standard("exact", dtype, 1, 0.0, 0.0)
    cls = CLASSES[op]
    u_acc = unit_roundoff(torch.float64 if dt == torch.float64 else torch.float32)
    k = max(int(k), 1)
    if op == "activation":
        acc = cls.c_acc * u_acc
    elif op == "attention":
        acc = cls.c_acc * u_acc * (math.sqrt(k) + max(logit, 0.0))
    else:
        acc = cls.c_acc * u_acc * math.sqrt(k) if k > 1 else 0.0
    return Standard(op, dtype, k, cls.c_out, acc, logit if op == "attention" else 0.0)


def ulp(golden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The unit in the last place of ``dtype`` at each value of ``golden`` (float64), the
    subnormal spacing below the smallest normal.

    >>> ulp(torch.tensor([1.0, 3.0], dtype=torch.float64), torch.bfloat16).tolist()
    [0.0078125, 0.015625]
    """
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(golden.abs().clamp_min(info.tiny))
    return torch.ldexp(torch.full_like(golden, info.eps), exponent - 1)
