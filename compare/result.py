"""What a compare gives back: per-tensor rows, per-node pairs and a summary, and their files.

``CompareResult.rows`` (pyarrow.Table; ``compare.csv`` / ``compare.parquet``), one row per
compared tensor:

- ``name_a``, ``name_b``: the tensor's name in each input, msprobe style
  (``<entry>.input.0``, ``<entry>.output.0``, ``<entry>.parameters.weight``,
  ``<parameters_grad entry>.weight``); null on the side that has no counterpart;
- ``node_a``, ``node_b``: the dump entries (names as they stand in the inputs);
- ``direction`` (forward|backward), ``slot`` (input|kwarg|output|parameter|parameter_grad),
  ``index`` (normalised: ``gamma``→``weight``, ``beta``→``bias``);
- ``match_method``: ``exact`` (same normalised name), ``mapping`` (a mapping file),
  ``structure`` (tree position, depth, class, shapes, execution order), ``ancestor`` (no
  counterpart: fused/unfused structure, compared at the nearest matched ancestor),
  ``unmatched``; the backward/parameter-gradient entries of a matched pair inherit its method;
- ``dtype_a``, ``dtype_b`` (normalised, e.g. ``float32``), ``shape_a``, ``shape_b``;
- ``max_a min_a mean_a norm_a``, ``max_b min_b mean_b norm_b``: the statistics;
- ``max_diff min_diff mean_diff norm_diff`` (b − a) and ``max_rel min_rel mean_rel norm_rel``
  (``|b − a| / |a|``, msprobe's relative error);
- ``err``: the dtype- and scale-aware error the verdict is graded on (see ``compare.verdict``);
- tensor mode only (when tensor files are readable): ``cosine``, ``max_abs_err``,
  ``max_rel_err``, ``rmse``, ``one_thousandth``, ``one_ten_thousandth`` (shares of elements
  within 1e-3 / 1e-4 relative); null otherwise;
- ``nonfinite_a``, ``nonfinite_b``: whether the side holds NaN/±Inf;
- ``hash_match``: md5 task: whether the hashes agree (null otherwise);
- ``file_a``, ``file_b``: tensor files (tensor task), ``ord``: execution order, ``row_id``;
- ``verdict``: the tensor verdict (:mod:`probe.compare.verdict`): ``pass`` | ``warning`` | ``error`` |
  ``nan`` (NaN/Inf on one side only) | ``unmatched``; ``reason``: why, in words.

``CompareResult.nodes`` (``nodes.parquet``), one row per node pair or unmatched node:
``node_a``, ``node_b`` (dump entries; a backward row names the ``backward`` entry, its
parameter gradients folded in), ``kind`` (module|api|comm), ``class_a``, ``class_b``,
``parent_a``, ``parent_b`` (parent entries, from construct.json), ``direction``,
``match_method`` (as for rows, plus ``container``: an extra wrapper level of one side whose
children are matched), ``order_a``, ``order_b``, ``ord`` (execution order: forward completion
order, backward after it), ``in_err``, ``out_err``, ``param_err`` (worst ``err`` of the inputs,
outputs, parameters), ``in_verdict``, ``out_verdict``, ``param_verdict``, ``precision_score``
(error growth input→output in [0, 1]: clip(out_err) − clip(in_err), floored at 0),
``precision_band`` (msprobe's bands: ``low`` < 0.3 ≤ ``medium`` < 0.6 ≤ ``high``),
``nonfinite_in_a``, ``nonfinite_out_a``, ``nonfinite_in_b``, ``nonfinite_out_b``,
``verdict`` (the node verdict, :mod:`probe.compare.verdict`), ``leaf_verdict`` (the worst of its
diverged forward inputs that no earlier call made: a parameter, the data; null when none),
``reason``, ``origin`` (a divergence
starts here), ``affected_by_a``, ``affected_by_b`` (an affected node: the origin its divergence
comes from; :func:`probe.compare.localise.with_impact`). For ``ancestor`` rows the other side's name
is the nearest matched ancestor's entry and the verdict is that pair's.

``CompareResult.summary`` (``summary.json``): ``a``, ``b`` (the files read), ``mode``
(statistics|tensor|md5), ``matched``, ``unmatched_a``, ``unmatched_b`` (node rows: entries
per direction), ``match_methods`` (counts), ``tensors``, ``verdicts`` (counts per verdict over
rows), ``node_verdicts``, ``counts`` (the same, labelled: ``{"tensors": {verdict: n},
"nodes": {verdict: n}, "unmatched": {"a": n, "b": m}, "counted": <what each counts>}``,
:func:`probe.compare.verdict.counts`), ``inputs`` (``{"a": {"path", "sha256", "bytes", "scheme"},
"b": ...}``: the fingerprints of the inputs read, :mod:`probe.compare.fingerprint`), ``first_divergence``
and ``first_nan`` (``null`` or ``{"a": <name in A>, "b": <name in B>, "direction":
"forward"|"backward", "reason": ...}``), ``worst`` (the worst pairs), ``notes``, ``elapsed_s``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["CompareResult"]


@dataclass
class CompareResult:
    """The outcome of :func:`probe.compare.api.compare`: per-tensor rows, per-node pairs and the summary."""

    rows: pa.Table
    nodes: pa.Table
    summary: dict[str, Any] = field(default_factory=dict)

    #: the folder :func:`probe.compare.api.compare` wrote the files to (its ``out``), None when it
    #: wrote none
    written: Path | None = None

    def write(self, out_dir: str | os.PathLike) -> Path:
        """Write compare.csv, compare.parquet, nodes.parquet and summary.json into ``out_dir``."""
        from probe.compare.report import write_result

        return write_result(self, Path(out_dir))

    @property
    def worst_verdict(self) -> str:
        """The worst tensor verdict (``nan`` > ``error`` > ``warning`` > ``pass``)."""
        from probe.compare.verdict import worst

        return worst(k for k, n in self.summary.get("verdicts", {}).items() if n)
