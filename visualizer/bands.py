"""Colour states of a node, and the precision score and band of a node pair.

A node is coloured by its state (:meth:`probe.visualizer.diff.DiffGraph.state`): its own verdict from
the compare (:mod:`probe.compare.verdict`: ``pass``, ``warning``, ``error``, ``nan``, ``unmatched``),
or ``none`` (no numerics to judge, e.g. a single dump).

The precision score is how much the relative error grows from a pair's inputs to its outputs;
msprobe's bands of it: ``pass`` < 0.3 ≤ ``warning`` < 0.6 ≤ ``error``. It grades a pair that
comes without a compare verdict (a diff built by hand), and it is what tells a module that
makes an error from one that only passes it on.

>>> band(0.1), band(0.3), band(0.6), band(None)
('pass', 'warning', 'error', 'none')
"""

from __future__ import annotations

import math
from typing import Iterable

from probe.visualizer.graph import TensorStat

PASS, WARNING, ERROR, NAN, UNMATCHED, NONE = "pass", "warning", "error", "nan", "unmatched", "none"
WARNING_AT = 0.3
ERROR_AT = 0.6

#: Fill colour of each state (``none``: no numerics, e.g. a single dump).
COLOURS: dict[str, str] = {
    PASS: "#b7e4c7",
    WARNING: "#ffd166",
    ERROR: "#ef476f",
    NAN: "#7b2cbf",
    UNMATCHED: "#c8c8c8",
    NONE: "#ffffff",
}

#: Severity order, worst last.
SEVERITY: dict[str, int] = {NONE: 0, PASS: 1, UNMATCHED: 2, WARNING: 3, ERROR: 4, NAN: 5}


def band(score: float | None) -> str:
    """The band of a precision score in [0, 1] (``none`` when there is no score)."""
    if score is None or (isinstance(score, float) and math.isnan(score)):
        return NONE
    if score >= ERROR_AT:
        return ERROR
    if score >= WARNING_AT:
        return WARNING
    return PASS


def _rel(a: float | None, b: float | None, scale: float) -> float:
    """Relative difference of one statistic of side A against the bench side B, in [0, 1]."""
    if a is None or b is None:
        return 0.0
    fa, fb = math.isfinite(a), math.isfinite(b)
    if not fa or not fb:
        return 0.0 if (not fa and not fb and (a == b or (math.isnan(a) and math.isnan(b)))) else 1.0
    if a == b:
        return 0.0
    return min(1.0, abs(a - b) / max(scale, 1e-30))


def tensor_error(a: TensorStat, b: TensorStat) -> float:
    """Relative error between two statistics records of the same tensor, in [0, 1].

    Max, Min and Mean are measured against the bench tensor's magnitude (its largest absolute
    Max/Min), the L2 norm against the bench norm; differing md5 hashes count as 1.
    """
    if a.md5 is not None and b.md5 is not None and a.md5 != b.md5 and a.max is None:
        return 1.0
    mag = max((abs(v) for v in (b.max, b.min) if v is not None and math.isfinite(v)), default=0.0)
    errs = [_rel(a.max, b.max, mag), _rel(a.min, b.min, mag), _rel(a.mean, b.mean, mag)]
    if b.norm is not None:
        errs.append(_rel(a.norm, b.norm, abs(b.norm)))
    return max(errs)


def _side_error(pairs: Iterable[tuple[TensorStat, TensorStat]]) -> float:
    return max((tensor_error(a, b) for a, b in pairs), default=0.0)


def node_score(tensors_a: list[TensorStat], tensors_b: list[TensorStat]) -> float | None:
    """Precision score of a node pair: output error minus input error, clipped to [0, 1].

    Tensors are paired by slot and index. ``None`` when the pair shares no output tensor.
    """
    by_key = {t.key: t for t in tensors_b if t.max is not None or t.md5 is not None}
    ins, outs = [], []
    for t in tensors_a:
        other = by_key.get(t.key)
        if other is None or (t.max is None and t.md5 is None):
            continue
        (outs if t.slot == "output" else ins if t.slot in ("input", "kwarg") else []).append((t, other))
    if not outs:
        return None
    return max(0.0, min(1.0, _side_error(outs) - _side_error(ins)))
