"""The precision standard of one API call: how much error its output may carry, per element.

A call is graded against the exact result of its own recorded inputs (the golden, computed in
float64). A correct kernel's output differs from it by two things only, and the standard allows
each:

1. **Rounding of the output** to its dtype: ``c_out`` units in the last place of the output
   dtype at the golden value (:func:`ulp`). ``c_out`` is 1 for an elementwise operation
   (correctly rounded is half a unit; one allows a faithful rounding), 4 for a transcendental
   one (``exp``, ``silu``, ``rsqrt``: vendor math libraries are good to a few units), 2 for a
   reduction (rounded once after accumulating).
2. **Accumulation** of a reduction of ``K`` terms (a matmul's inner dimension, a softmax or
   norm row, a sum): ``C_ACC · u_acc · sqrt(K) · S``, where ``u_acc`` is the unit roundoff of
   the accumulator a kernel is expected to use (float32 for float32, bfloat16 and float16
   outputs: every current kernel accumulates those in float32; float64 for float64) and ``S``
   is the magnitude of the terms (the classic bound of a sum's rounding error, which keeps an
   output near zero by cancellation from looking wrong): for a matrix product the product of the
   row and column norms (Cauchy-Schwarz), for other sums of the inputs (sum, mean, conv) the
   same call on the inputs' absolute values, else the output's own magnitude, floored at its
   root mean square.

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

#: the accumulation term's constant (calibrated on float32 kernels of the bundled engine: the
#: largest accumulation error seen is under a seventh of this budget)
C_ACC = 4.0
#: output rounding allowance, in units in the last place, per class of operation
C_OUT = {"exact": 0.0, "elementwise": 1.0, "transcendental": 4.0, "reduction": 2.0, "matmul": 2.0}

_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
for _n in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _n):
        _DTYPES[f"torch.{_n}"] = getattr(torch, _n)


@dataclass(frozen=True)
class Standard:
    """What the output of one call may carry: see the module docstring."""

    op: str           # exact | elementwise | transcendental | reduction | matmul
    dtype: str        # the output dtype, as the dump writes it ("torch.bfloat16")
    k: int            # terms per output element (1: elementwise)
    c_out: float      # output rounding allowance, units in the last place
    acc: float        # accumulation allowance, relative to the terms' magnitude

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
            allowed += " + float64 accumulation" if self.dtype == "torch.float64" else " + float32 accumulation"
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


def standard(api: str, dtype: str, k: int) -> Standard:
    """The standard of a call of ``api`` whose output has ``dtype`` and sums ``k`` terms."""
    op = op_class(api)
    dt = torch_dtype(dtype)
    if dt is None:
        return Standard("exact", dtype, 1, 0.0, 0.0)
    acc_dtype = torch.float64 if dt == torch.float64 else torch.float32
    acc = C_ACC * unit_roundoff(acc_dtype) * math.sqrt(k) if k > 1 and op != "exact" else 0.0
    return Standard(op, dtype, max(int(k), 1), C_OUT[op], acc)


def ulp(golden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The unit in the last place of ``dtype`` at each value of ``golden`` (float64), the
    subnormal spacing below the smallest normal.

    >>> ulp(torch.tensor([1.0, 3.0], dtype=torch.float64), torch.bfloat16).tolist()
    [0.0078125, 0.015625]
    """
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(golden.abs().clamp_min(info.tiny))
    return torch.ldexp(torch.full_like(golden, info.eps), exponent - 1)
