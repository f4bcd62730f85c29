"""The results of an API precision check: the table, ``check_api.csv``/``.parquet`` and
``summary.json``.

One row per recorded call (:data:`COLUMNS`); the files list them by severity (``nan``,
``error``, ``warning``, ``pass``, then ``skipped``), each severity in execution order.
``summary.json`` holds the counts per verdict, the first failing call in execution order (the
earliest ``nan`` or ``error``; a ``warning`` when there is none) with its reason, the golden,
and the skip reasons counted.

>>> rows = [{"step": 0, "rank": 0, "order": 2, "name": "Torch.exp.0.forward", "verdict": "pass"},
...         {"step": 0, "rank": 0, "order": 5, "name": "Functional.linear.1.forward", "verdict": "error",
...          "reason": "beyond ..."}]
>>> s = summarise(rows, golden="cpu-fp64", source="d")
>>> s["counts"]["error"], s["first_failure"]["name"]
(1, 'Functional.linear.1.forward')
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from probe.checker.grade import METRICS
from probe.compare.verdict import VERDICT_RANK

#: the columns of check_api.csv / .parquet, in order
COLUMNS = ("step", "rank", "order", "name", "api", "op", "dtype", "shape", "k", "verdict", "reason",
           *METRICS, "parent")
#: verdicts of a check, worst first (``skipped``: not replayed, with the reason)
CHECK_VERDICTS = ("nan", "error", "warning", "pass", "skipped")
_SEVERITY = {v: i for i, v in enumerate(CHECK_VERDICTS)}


def sort_rows(rows: Sequence[dict]) -> list[dict]:
    """``rows`` by severity, then execution order (step, rank, order)."""
    return sorted(rows, key=lambda r: (_SEVERITY.get(r.get("verdict"), 9), r.get("step", 0),
                                       r.get("rank", 0), r.get("order", 0)))


def first_failure(rows: Sequence[dict]) -> dict | None:
    """The earliest call in execution order whose verdict is ``nan`` or ``error`` (else the
    earliest ``warning``; None when every call passed or was skipped)."""
    for level in ("error", "warning"):
        bad = [r for r in rows if r.get("verdict") in VERDICT_RANK and
               VERDICT_RANK[r["verdict"]] >= VERDICT_RANK[level]]
        if bad:
            r = min(bad, key=lambda r: (r.get("step", 0), r.get("rank", 0), r.get("order", 0)))
            return {k: r.get(k) for k in ("step", "rank", "order", "name", "api", "verdict", "reason", "parent")}
    return None


def summarise(rows: Sequence[dict], *, golden: str, source: str, seconds: float | None = None) -> dict[str, Any]:
    """The summary.json document of a check."""
    counts = Counter(r.get("verdict") for r in rows)
    skips = Counter(_skip_kind(r.get("reason") or "") for r in rows if r.get("verdict") == "skipped")
    return {
        "source": source, "golden": golden, "calls": len(rows),
        "counts": {v: counts.get(v, 0) for v in CHECK_VERDICTS},
        "first_failure": first_failure(rows),
        "skipped_by_reason": dict(skips.most_common()),
        "seconds": round(seconds, 3) if seconds is not None else None,
        "columns": list(COLUMNS),
    }


def _skip_kind(reason: str) -> str:
    return reason.split(":", 1)[0] if ":" in reason else reason


def write(rows: Sequence[dict], summary: dict, out: str | Path) -> Path:
    """Write ``check_api.csv``, ``check_api.parquet`` and ``summary.json`` into ``out``."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    ordered = sort_rows(rows)
    columns = {c: [_plain(r.get(c)) for r in ordered] for c in COLUMNS}
    types = {"step": pa.int64(), "rank": pa.int64(), "order": pa.int64(), "k": pa.int64(),
             "shape": pa.list_(pa.int64()), **{m: pa.float64() for m in METRICS}}
    table = pa.table({c: pa.array(v, type=types.get(c, pa.string())) for c, v in columns.items()})
    pq.write_table(table, folder / "check_api.parquet")
    csv_table = table.set_column(COLUMNS.index("shape"), "shape",
                                 pa.array([None if s is None else str(s) for s in columns["shape"]], pa.string()))
    pcsv.write_csv(csv_table, folder / "check_api.csv")
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return folder


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else v
    return v


def format_table(rows: Sequence[dict], limit: int = 20) -> str:
    """The worst ``limit`` calls as a text table (verdict, call, dtype, reason)."""
    ordered = [r for r in sort_rows(rows) if r.get("verdict") != "pass"][:limit]
    if not ordered:
        return "every replayed call passed"
    width = min(max(len(str(r.get("name"))) for r in ordered), 48)
    lines = [f"{'verdict':8s} {'call':{width}s} {'dtype':9s} reason"]
    for r in ordered:
        dtype = (r.get("dtype") or "-").replace("torch.", "")
        lines.append(f"{r.get('verdict', ''):8s} {str(r.get('name'))[:width]:{width}s} {dtype:9s} {r.get('reason', '')}")
    return "\n".join(lines)


def format_summary(summary: dict) -> str:
    """The closing lines of a check: counts, the first failing call."""
    c = summary["counts"]
    line = (f"{summary['calls']} calls checked against {summary['golden']}: "
            + ", ".join(f"{v} {c[v]}" for v in CHECK_VERDICTS if c.get(v)))
    first = summary.get("first_failure")
    if first:
        line += (f"\nfirst failing call: {first['name']} (step {first['step']}, rank {first['rank']}): "
                 f"{first['verdict']}: {first['reason']}")
    else:
        line += "\nno failing call"
    return line
