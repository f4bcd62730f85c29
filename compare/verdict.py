"""Verdicts: what a tensor verdict and a node verdict are, the tolerances they are graded on,
and the labelled counts every report shows. The one definition: the SQL of the compare, the
summary, compare.csv/nodes.parquet, the terminal and the web all take it from here.

**Tensor verdict** (one per row of compare.csv), in order of severity:

- ``pass``: the pair agrees within the tolerance of its dtype (or is identical by md5);
- ``warning``: ``err`` is above the pass tolerance and at most the warning tolerance;
- ``error``: ``err`` is above the warning tolerance, or the shapes differ, or both sides hold
  NaN/Inf but not the same;
- ``nan``: NaN/Inf on one side and not on the other (its own state, worse than ``error``);
- ``unmatched``: no counterpart on the other side (not graded).

**Node verdict** (one per row of nodes.parquet: a node pair in one direction, or a node
without a counterpart): a node matched with a counterpart of its own takes the worst verdict of
its own tensors, those it produces or holds (outputs, parameters, parameter gradients); its
inputs are another node's outputs, graded there, and count only for a node that has none of
its own. A node compared inside its nearest matched ancestor (``ancestor``: fused/unfused
structure) takes that pair's verdict; an extra wrapper level of one side (``container``) the
worst of its children's; a node with neither a counterpart nor a matched ancestor is
``unmatched``.

**The error measure.** The error of a statistics pair is not msprobe's plain ``|b − a| / |a|``,
which is meaningless for statistics near zero (the mean of a gradient, a bias gradient that is
zero in exact arithmetic) and grades every cross-framework row wrong. Instead each statistic's
difference is divided by a *scale*:

- ``max``, ``min``, ``mean``: the tensor's magnitude ``M = max(|max|, |min|)`` over both sides;
- ``norm``: the larger of the two norms;

and every scale is floored at ``CONTEXT_FLOOR`` × the largest magnitude of any tensor at the
same node and direction, so rounding noise in a tensor that is tiny next to its neighbours
is not a divergence. Before the ladder, two rules settle a pair (docs/compare.md, "Verdict
rules"): a pair whose values on both sides are within ``NOISE_ULPS`` × eps(dtype) × the
magnitude around it (largest |value| or L2 norm at the node and direction) is rounding noise
of a zero and passes; a pair one side of which holds nothing read (uninitialised or freed
memory: no statistics, hash or file) is not compared. ``err`` is the largest of the four; the verdict compares it with the
tolerance of the looser of the two dtypes (:data:`TOLERANCES`). Two float32 runs of one network
in two frameworks differ by ~1e-6, well inside float32's 1e-4.

**The ladder** (:data:`LADDER`): an error measure at most the pass bound passes, at most the
warning bound warns, anything else (above it, or NaN) is an error. It is defined once and
rendered twice: :func:`ladder_sql` for DuckDB (the tensor rows), :func:`grade` vectorised in
NumPy (the tensor-mode regrading of :mod:`probe.compare.metrics`, and :mod:`probe.checker.grade`,
whose bounds are its precision budget).

>>> tolerance("float32"), tolerance("bfloat16")
((0.0001, 0.001), (0.02, 0.08))
>>> worst(["pass", "error", "warning"]), worst(["error", "nan"]), worst([])
('error', 'nan', 'pass')
>>> grade([1e-5, 5e-4, 2e-3, float("nan")], 1e-4, 1e-3).tolist()
['pass', 'warning', 'error', 'error']
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["TOLERANCES", "CONTEXT_FLOOR", "EPS", "NOISE_ULPS", "eps_sql", "VERDICTS", "GRADED", "VERDICT_RANK", "COUNTED", "LADDER",
           "tolerance", "tolerances", "tolerance_sql", "ladder_sql", "grade", "severity", "worst",
           "at_least", "rank_sql", "worst_sql", "worst_of_sql", "tensor_verdict_sql", "node_verdict_sql",
           "counts", "format_counts"]

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
#: Machine epsilon of each floating dtype (the rounding unit the noise floor is counted in).
EPS: dict[str, float] = {
    "float64": 2.220446049250313e-16, "double": 2.220446049250313e-16, "complex128": 2.220446049250313e-16,
    "float32": 1.1920928955078125e-07, "float": 1.1920928955078125e-07, "complex64": 1.1920928955078125e-07,
    "tensorfloat32": 9.765625e-04, "float16": 9.765625e-04, "half": 9.765625e-04, "bfloat16": 7.8125e-03,
    "float8_e4m3fn": 0.125, "float8_e5m2": 0.25, "hifloat8": 0.25,
}
#: The noise floor, in rounding units: a pair whose values on both sides are at most this many
#: epsilons of its dtype times the magnitude around it (the largest |value| or L2 norm of any
#: tensor at the same node and direction: the op's inputs, its other outputs) is rounding noise
#: of a value that is zero in exact arithmetic, and passes.
NOISE_ULPS = 8.0
#: Every verdict, worst first (the order counts are listed in).
VERDICTS = ("nan", "error", "warning", "pass", "unmatched")
#: The verdicts of a graded pair, mildest first.
GRADED = ("pass", "warning", "error", "nan")
#: Severity of each verdict (for "worst of"); ``unmatched`` is not graded.
VERDICT_RANK = {"pass": 0, "unmatched": 0, "warning": 1, "error": 2, "nan": 3}
#: The ladder: (verdict, the bound an error measure must not exceed to get it), mildest first;
#: a measure beyond every bound (or NaN) is :data:`LADDER_ELSE`.
LADDER = (("pass", "tol_pass"), ("warning", "tol_warn"))
LADDER_ELSE = "error"
#: What each count of :func:`counts` counts, in words (summary.json carries it).
COUNTED = {
    "tensors": "rows of compare.csv: one per tensor pair, or tensor without a counterpart",
    "nodes": "rows of nodes.parquet: one per node pair and direction, or node without a counterpart",
    "unmatched": "nodes without a counterpart, per side (node verdict 'unmatched')",
}


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


def tolerances(dtypes: Any) -> tuple[Any, Any]:
    """(pass, warning) tolerances of a column of normalised dtype names (an Arrow array, nulls
    allowed) as two float64 NumPy arrays: :func:`tolerance` once per distinct name.

    >>> import pyarrow as pa
    >>> [t.tolist() for t in tolerances(pa.array(["float32", None, "int64"]))]
    [[0.0001, 0.0001, 0.0], [0.001, 0.001, 0.0]]
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(dtypes, pa.ChunkedArray):
        dtypes = dtypes.combine_chunks()
    enc = pc.dictionary_encode(dtypes, null_encoding="encode")
    table = np.array([tolerance(d) for d in enc.dictionary.to_pylist()], dtype=np.float64).reshape(-1, 2)
    at = enc.indices.to_numpy(zero_copy_only=False)
    return table[at, 0], table[at, 1]


def ladder_sql(err: str, tol_pass: str, tol_warn: str) -> str:
    """SQL: the :data:`LADDER` verdict of the error expression ``err`` between the bounds
    ``tol_pass`` and ``tol_warn`` (a null ``err`` is an error, as NaN is in :func:`grade`).

    >>> ladder_sql("err", "p", "w")
    "(case when err <= p then 'pass' when err <= w then 'warning' else 'error' end)"
    """
    bound = {"tol_pass": tol_pass, "tol_warn": tol_warn}
    whens = " ".join(f"when {err} <= {bound[b]} then '{v}'" for v, b in LADDER)
    return f"(case {whens} else '{LADDER_ELSE}' end)"


def grade(err: Any, tol_pass: Any, tol_warn: Any) -> Any:
    """The :data:`LADDER` verdict of each error in ``err`` (a NumPy array, or a number: then a
    string) between the bounds ``tol_pass`` and ``tol_warn`` (numbers or arrays alike), as
    :func:`ladder_sql` gives it in SQL.

    >>> grade(0.5, 1.0, 1000.0), grade(2.0, 1.0, 1000.0)
    ('pass', 'warning')
    """
    import numpy as np

    e = np.asarray(err, dtype=np.float64)
    bound = {"tol_pass": np.asarray(tol_pass, dtype=np.float64), "tol_warn": np.asarray(tol_warn, dtype=np.float64)}
    with np.errstate(invalid="ignore"):
        out = np.select([e <= bound[b] for _, b in LADDER], [v for v, _ in LADDER], LADDER_ELSE)
    return str(out) if out.ndim == 0 else out


def severity(verdicts: Any) -> Any:
    """:data:`VERDICT_RANK` of each verdict in ``verdicts`` (an Arrow or NumPy array of names)
    as a NumPy array; a null or unknown verdict ranks 0.

    >>> severity(["nan", None, "warning"]).tolist()
    [3, 0, 1]
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(verdicts, pa.ChunkedArray):
        verdicts = verdicts.combine_chunks()
    if not isinstance(verdicts, pa.Array):
        verdicts = pa.array(np.asarray(verdicts, dtype=object), type=pa.string())
    ranks = np.array([*VERDICT_RANK.values(), 0], dtype=np.int64)
    at = pc.index_in(verdicts.cast(pa.string()), value_set=pa.array(list(VERDICT_RANK), type=pa.string()))
    return ranks[pc.fill_null(at, len(VERDICT_RANK)).to_numpy(zero_copy_only=False)]


def tolerance_sql(col: str) -> tuple[str, str]:
    """SQL expressions (pass tol, warn tol) for a dtype column."""
    def case(k: int) -> str:
        whens = " ".join(f"when '{d}' then {t[k]!r}" for d, t in TOLERANCES.items())
        return (f"(case when {col} in ('bool') or {col} like 'int%' or {col} like 'uint%' "
                f"or {col} like 'long%' then 0.0 else (case {col} {whens} else {_DEFAULT[k]!r} end) end)")
    return case(0), case(1)


def eps_sql(col: str) -> str:
    """SQL: the machine epsilon (:data:`EPS`) of a normalised dtype column; 0 for integers, bools
    and unknown names (no rounding: no noise floor).

    >>> eps_sql("d").startswith("(case d when 'float64' then 2.22")
    True
    """
    whens = " ".join(f"when '{d}' then {e!r}" for d, e in EPS.items())
    return f"(case {col} {whens} else 0.0 end)"


def worst(verdicts: Iterable[str | None]) -> str:
    """The worst graded verdict of ``verdicts`` (``pass`` when there is none)."""
    return max((v for v in verdicts if v in GRADED), key=VERDICT_RANK.__getitem__, default="pass")


def at_least(verdict: str | None, level: str) -> bool:
    """Whether ``verdict`` is as bad as ``level`` or worse (``nan`` is worse than ``error``).

    >>> at_least("nan", "error"), at_least("warning", "error"), at_least("unmatched", "warning")
    (True, False, False)
    """
    return verdict in GRADED and VERDICT_RANK[verdict] >= VERDICT_RANK[level]


def rank_sql(expr: str) -> str:
    """SQL: the severity of the verdict ``expr`` (null for null or ``unmatched``)."""
    return f"(case {expr} " + " ".join(f"when '{v}' then {VERDICT_RANK[v]}" for v in GRADED) + " end)"


def _name_sql(rank: str) -> str:
    return f"(case {rank} " + " ".join(f"when {VERDICT_RANK[v]} then '{v}'" for v in GRADED) + " end)"


def worst_sql(cond: str) -> str:
    """SQL aggregate: the worst verdict of the rows matching ``cond`` (null when none)."""
    return _name_sql(f"max({rank_sql('verdict')}) filter (where {cond})")


def worst_of_sql(*exprs: str) -> str:
    """SQL: the worst of several verdict expressions (null when all are null)."""
    ranks = ", ".join(f"coalesce({rank_sql(e)}, -1)" for e in exprs)
    return _name_sql(f"nullif(greatest({ranks}), -1)")


def tensor_verdict_sql(present_a: str, present_b: str) -> str:
    """SQL: the tensor verdict of a row (see the module docstring). ``present_a``/``present_b``:
    whether each side has the tensor; the row's other columns read: ``uninit`` (an empty
    tensor's uninitialised memory, or a side without statistics: not compared),
    ``nonfinite_a``/``_b``, ``numel_a``/``_b``, ``hash_a``/``_b``, ``noise`` (both sides within
    the noise floor, :data:`NOISE_ULPS`), ``err``, ``tol_pass``, ``tol_warn``."""
    return f"""(case when not {present_a} or not {present_b} then 'unmatched'
           when uninit then 'pass'
           when nonfinite_a is distinct from nonfinite_b then 'nan'
           when numel_a is not null and numel_b is not null and numel_a <> numel_b then 'error'
           when hash_a is not null and hash_a = hash_b then 'pass'
           when noise then 'pass'
           else {ladder_sql("err", "tol_pass", "tol_warn")} end)"""


def node_verdict_sql(out: str, param: str, inp: str) -> str:
    """SQL: the verdict of a node matched with its own counterpart, from the worst verdicts of
    its outputs, parameters (with their gradients) and inputs (see the module docstring)."""
    return (f"(case when {out} is null and {param} is null then coalesce({inp}, 'pass') "
            f"else {worst_of_sql(out, param)} end)")


def counts(tensor_verdicts: Any, node_verdicts: Any, node_a: Any, node_b: Any) -> dict[str, Any]:
    """The labelled counts of one compare: ``{"tensors": {verdict: n}, "nodes": {verdict: n},
    "unmatched": {"a": n, "b": m}, "counted": ...}``, every verdict listed (zeros too).

    ``tensor_verdicts``: the ``verdict`` column of compare.csv; ``node_verdicts``, ``node_a``,
    ``node_b``: those columns of nodes.parquet (Arrow arrays or Python sequences).

    >>> c = counts(["pass", "error", "pass"], ["error", "unmatched"], ["x", None], ["y", "z"])
    >>> c["tensors"]["pass"], c["nodes"]["error"], c["unmatched"]
    (2, 1, {'a': 0, 'b': 1})
    """
    import pyarrow.compute as pc

    verdict = _strings(node_verdicts)

    def tally(values: Any) -> dict[str, int]:
        found = {v["values"]: int(v["counts"]) for v in pc.value_counts(values).to_pylist()}
        return {v: found.get(v, 0) for v in VERDICTS}

    def side(names: Any) -> int:
        return int(pc.sum(pc.and_(pc.equal(verdict, "unmatched"), pc.is_valid(_strings(names)))).as_py() or 0)
    return {"tensors": tally(_strings(tensor_verdicts)), "nodes": tally(verdict),
            "unmatched": {"a": side(node_a), "b": side(node_b)}, "counted": dict(COUNTED)}


def _strings(values: Any) -> Any:
    """A column (Arrow, dictionary-encoded or not, or a Python sequence) as one string array."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values.cast(pa.string())
    return pa.array(list(values), pa.string())


def format_counts(c: dict[str, Any], sep: str = "\n") -> str:
    """The labelled count lines of :func:`counts` (verdicts worst first, zeros left out).

    >>> print(format_counts({"tensors": {"error": 43, "pass": 32, "nan": 0}, "nodes": {"pass": 3},
    ...                      "unmatched": {"a": 0, "b": 2}}))
    tensors: error 43, pass 32
    nodes: pass 3
    unmatched: A 0, B 2
    """
    def line(kind: str) -> str:
        got = c.get(kind) or {}
        return f"{kind}: " + (", ".join(f"{v} {got[v]}" for v in VERDICTS if got.get(v)) or "none")
    un = c.get("unmatched") or {}
    return sep.join([line("tensors"), line("nodes"), f"unmatched: A {un.get('a', 0)}, B {un.get('b', 0)}"])
