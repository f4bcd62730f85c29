"""Statistics of a host array with NumPy, for the adapters' paths without the native kernel.

>>> import numpy as np
>>> array_stats(np.array([1e20, -3e20, 2.0], dtype=np.float32))[3]     # 1e40 + 9e40: past float32
1.000000040081755e+41
"""

from __future__ import annotations

import math

import numpy as np


def array_stats(a: np.ndarray, total: float | None = None) -> list[float]:
    """``[max, min, sum, sumsq, nan_count, inf_count]`` of a flat float array: SIMD ``max``/
    ``min``, a BLAS dot for the sum of squares, NaN/Inf counted only when the sums are not
    finite; when every value is finite but a float32 sum overflowed (values past ~1.8e19
    squared), the sums again in float64. ``total``: the sum when the caller has it."""
    s = float(a.sum(dtype=np.float64)) if total is None else total
    q = float(np.dot(a, a))
    if math.isfinite(s) and math.isfinite(q):
        return [float(a.max()), float(a.min()), s, q, 0.0, 0.0]
    nan, inf = float(np.count_nonzero(np.isnan(a))), float(np.count_nonzero(np.isinf(a)))
    if not nan and not inf:
        d = a.astype(np.float64)
        s, q = float(d.sum()), float(np.dot(d, d))
    return [float(a.max()), float(a.min()), s, q, nan, inf]
