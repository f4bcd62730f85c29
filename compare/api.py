"""The compare API: two dumps in, matched pairs, metrics, verdicts and localisation out.

>>> from probe.compare.api import compare
>>> r = compare("/work/shared/data/msprobe/mindspore_L0/step0/proc0/dump.json",
...             "/work/shared/data/msprobe/torch_L0/step0/proc0/dump.json")   # doctest: +SKIP
>>> r.summary["verdicts"], r.summary["first_divergence"]                         # doctest: +SKIP
({'pass': 99}, None)
>>> r.write("out/compare")                                                        # doctest: +SKIP

Inputs (``a`` and ``b``): a ``dump.json`` (construct.json and stack.json beside it), a step or
rank folder (or any folder above one: the lowest step and rank are taken), or a run folder
holding our Arrow store (``RUN/store/``). Either side may be msprobe-written or ours, PyTorch or
MindSpore.

The result's columns and summary: :mod:`probe.compare.result`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa

from probe.compare.result import CompareResult
from probe.ground.errors import ProbeError

__all__ = ["CompareResult", "compare", "load_result"]


def compare(a: str, b: str, mapping: str | None = None, progress: bool = False,
            out: str | os.PathLike | None = None, parallel: bool = True) -> CompareResult:
    """Compare dump ``a`` against dump ``b``; see :mod:`probe.compare.result` for the result's columns.

    ``mapping``: an msprobe mapping file (``layer_mapping.yaml``, a cell/API/data mapping
    YAML) applied before structural matching. ``progress``: show a progress bar on stderr.
    ``out``: a folder to write compare.csv, compare.parquet, nodes.parquet and summary.json to,
    each as soon as its part is computed (faster than :meth:`CompareResult.write` afterwards);
    ``summary.json``'s ``elapsed_s`` then covers the writing too. ``parallel=False``: one
    core (no worker process or threads of its own beyond the files' writer), for callers that
    compare many pairs at once (:mod:`probe.compare.ranks`); the result is the same.
    """
    from probe.compare.pipeline import compare_paths

    t0 = time.perf_counter()
    with _Progress(progress) as bar:
        result = compare_paths(a, b, mapping=mapping, bar=bar,
                               out=Path(out) if out is not None else None, parallel=parallel)
    result.summary["elapsed_s"] = round(time.perf_counter() - t0, 3)
    if result.written is not None:      # summary.json was written before elapsed_s was known
        from probe.compare.report import write_summary

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
    _same_result(out, summary, rows, nodes)
    return CompareResult(rows=rows, nodes=nodes, summary=summary)


def _same_result(out: Path, summary: object, rows: pa.Table, nodes: pa.Table) -> None:
    """Refuse a folder whose summary.json and Parquet files come from different compares (each
    carries its compare's id, :data:`probe.compare.report.RESULT_ID_KEY`; a result written
    before ids were is taken as it is)."""
    from probe.compare.report import RESULT_ID_KEY

    want = summary.get(RESULT_ID_KEY) if isinstance(summary, dict) else None
    key = RESULT_ID_KEY.encode()
    for name, table in (("compare.parquet", rows), ("nodes.parquet", nodes)):
        got = (table.schema.metadata or {}).get(key)
        if want is None and got is None:
            continue
        if got is None or want is None or got.decode(errors="replace") != want:
            raise ProbeError(f"{out / name}: not from the same compare as {out / 'summary.json'} (a "
                             "compare stopped while writing, or files copied from another result); "
                             "run 'probe compare --out' again")


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
