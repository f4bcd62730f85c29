"""The compare API: two dumps in, matched pairs, metrics, verdicts and localisation out.

>>> from compare.api import compare
>>> r = compare("/work/shared/data/msprobe/mindspore_L0/step0/proc0/dump.json",
...             "/work/shared/data/msprobe/torch_L0/step0/proc0/dump.json")   # doctest: +SKIP
>>> r.summary["verdicts"], r.summary["first_divergence"]                         # doctest: +SKIP
({'pass': 99}, None)
>>> r.write("out/compare")                                                        # doctest: +SKIP

Inputs (``a`` and ``b``): a ``dump.json`` (construct.json and stack.json beside it), a step or
rank folder (or any folder above one: the lowest step and rank are taken), or a run folder
holding our Arrow store (``RUN/store/``). Either side may be msprobe-written or ours, PyTorch or
MindSpore.

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
- ``verdict``: ``pass`` | ``warning`` | ``error`` | ``unmatched``; ``reason``: why, in words.

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
``verdict``, ``reason``. For ``ancestor`` rows the other side's name is the nearest matched
ancestor's entry and the verdict is that pair's.

``CompareResult.summary`` (``summary.json``): ``a``, ``b`` (the files read), ``mode``
(statistics|tensor|md5), ``matched``, ``unmatched_a``, ``unmatched_b`` (node rows: entries
per direction), ``match_methods`` (counts), ``tensors``, ``verdicts`` (counts per verdict over
rows), ``node_verdicts``, ``first_divergence``
and ``first_nan`` (``null`` or ``{"a": <name in A>, "b": <name in B>, "direction":
"forward"|"backward", "reason": ...}``), ``worst`` (the worst pairs), ``notes``, ``elapsed_s``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from ground.errors import ProbeError

__all__ = ["CompareResult", "compare", "load_result"]


@dataclass
class CompareResult:
    """The outcome of :func:`compare`: per-tensor rows, per-node pairs and the summary."""

    rows: pa.Table
    nodes: pa.Table
    summary: dict[str, Any] = field(default_factory=dict)

    #: the folder :func:`compare` wrote the files to (its ``out``), None when it wrote none
    written: Path | None = None

    def write(self, out_dir: str | os.PathLike) -> Path:
        """Write compare.csv, compare.parquet, nodes.parquet and summary.json into ``out_dir``."""
        from compare.report import write_result

        return write_result(self, Path(out_dir))

    @property
    def worst_verdict(self) -> str:
        """``error`` if any pair errs, else ``warning`` if any warns, else ``pass``."""
        v = self.summary.get("verdicts", {})
        return "error" if v.get("error") else "warning" if v.get("warning") else "pass"


def compare(a: str, b: str, mapping: str | None = None, progress: bool = False,
            out: str | os.PathLike | None = None) -> CompareResult:
    """Compare dump ``a`` against dump ``b``; see the module docstring for the result's columns.

    ``mapping``: an msprobe mapping file (``layer_mapping.yaml``, a cell/API/data mapping
    YAML) applied before structural matching. ``progress``: show a progress bar on stderr.
    ``out``: a folder to write compare.csv, compare.parquet, nodes.parquet and summary.json to,
    each as soon as its part is computed (faster than :meth:`CompareResult.write` afterwards);
    ``summary.json``'s ``elapsed_s`` then covers the writing too.
    """
    from compare.pipeline import compare_paths

    t0 = time.perf_counter()
    with _Progress(progress) as bar:
        result = compare_paths(a, b, mapping=mapping, bar=bar,
                               out=Path(out) if out is not None else None)
    result.summary["elapsed_s"] = round(time.perf_counter() - t0, 3)
    if result.written is not None:      # summary.json was written before elapsed_s was known
        from compare.report import write_summary

        try:
            write_summary(result.summary, result.written)
        except OSError as e:
            raise ProbeError(f"{result.written}: cannot write the compare result ({e.strerror})") from None
    return result


def load_result(out_dir: str | os.PathLike) -> CompareResult:
    """Read back a result written by :meth:`CompareResult.write`."""
    import pyarrow.parquet as pq

    out = Path(out_dir)
    for name in ("compare.parquet", "nodes.parquet", "summary.json"):
        if not (out / name).exists():
            raise ProbeError(f"{out / name}: missing; give a folder written by 'probe compare --out'")
    try:
        rows = pq.read_table(out / "compare.parquet")
        nodes = pq.read_table(out / "nodes.parquet")
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError, pa.ArrowException) as e:
        raise ProbeError(f"{out}: unreadable compare result ({str(e).splitlines()[0]})") from None
    return CompareResult(rows=rows, nodes=nodes, summary=summary)


class _Progress:
    """A small stage progress bar (tqdm on stderr) that is silent when disabled."""

    STAGES = 7

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar = None

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self.STAGES, desc="compare", unit="stage", leave=False)
        return self

    def step(self, what: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(what)
            self._bar.update(1)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
