"""Verdicts: dtype-aware tolerances and the error measure each tensor pair is graded on.

The error of a statistics pair is not msprobe's plain ``|b − a| / |a|``, which is meaningless
for statistics near zero (the mean of a gradient, a bias gradient that is zero in exact
arithmetic) and grades every cross-framework row wrong. Instead each statistic's difference
is divided by a *scale*:

- ``max``, ``min``, ``mean``: the tensor's magnitude ``M = max(|max|, |min|)`` over both sides;
- ``norm``: the larger of the two norms;

and every scale is floored at ``CONTEXT_FLOOR`` × the largest magnitude of any tensor at the
same node and direction, so rounding noise in a tensor that is tiny next to its neighbours
is not a divergence. ``err`` is the largest of the four; the verdict compares it with the
tolerance of the looser of the two dtypes (:data:`TOLERANCES`): ``pass`` ≤ pass tolerance <
``warning`` ≤ warn tolerance < ``error``. Two float32 runs of one network in two frameworks
differ by ~1e-6, well inside float32's 1e-4.

>>> tolerance("float32"), tolerance("bfloat16")
((0.0001, 0.001), (0.02, 0.08))
"""

from __future__ import annotations

__all__ = ["TOLERANCES", "CONTEXT_FLOOR", "tolerance", "tolerance_sql", "VERDICT_RANK"]

#: dtype → (pass tolerance, warning tolerance) on ``err``.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-5), "double": (1e-7, 1e-5), "complex128": (1e-7, 1e-5),
    "float32": (1e-4, 1e-3), "float": (1e-4, 1e-3), "complex64": (1e-4, 1e-3),
    "tensorfloat32": (2e-3, 1e-2),
    "float16": (5e-3, 2e-2), "half": (5e-3, 2e-2),
    "bfloat16": (2e-2, 8e-2),
    "float8_e4m3fn": (1.25e-1, 2.5e-1), "float8_e5m2": (2.5e-1, 5e-1), "hifloat8": (2.5e-1, 5e-1),
}
_DEFAULT = (1e-4, 1e-3)
_EXACT = (0.0, 0.0)
#: Scales are floored at this share of the largest magnitude at the same node and direction.
CONTEXT_FLOOR = 1e-2
#: Severity order of verdicts (for "worst of").
VERDICT_RANK = {"pass": 0, "unmatched": 0, "warning": 1, "error": 2}


def tolerance(dtype: str | None) -> tuple[float, float]:
    """(pass, warning) tolerance of a normalised dtype name; integers and bools are exact."""
    if not dtype:
        return _DEFAULT
    d = dtype.lower()
    if d in TOLERANCES:
        return TOLERANCES[d]
    if d.startswith(("int", "uint", "bool", "long")):
        return _EXACT
    return _DEFAULT


def tolerance_sql(col: str) -> tuple[str, str]:
    """SQL expressions (pass tol, warn tol) for a dtype column."""
    def case(k: int) -> str:
        whens = " ".join(f"when '{d}' then {t[k]!r}" for d, t in TOLERANCES.items())
        return (f"(case when {col} in ('bool') or {col} like 'int%' or {col} like 'uint%' "
                f"or {col} like 'long%' then 0.0 else (case {col} {whens} else {_DEFAULT[k]!r} end) end)")
    return case(0), case(1)
