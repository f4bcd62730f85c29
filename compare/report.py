r"""Reports: summary.json contents, the output files and the terminal summary.

Every count is labelled with what it counts (:func:`probe.compare.verdict.counts`): tensors (rows of
compare.csv), nodes (rows of nodes.parquet), unmatched nodes per side.

>>> print("\n".join(format_summary({"a": "A", "b": "B", "matched": 2, "unmatched_a": 0,
...     "unmatched_b": 0, "match_methods": {"exact": 2}, "verdicts": {"pass": 4},
...     "counts": {"tensors": {"pass": 4}, "nodes": {"pass": 2}, "unmatched": {"a": 0, "b": 0}},
...     "first_divergence": None, "first_nan": None, "worst": []}).splitlines()[1:5]))
matched 2 nodes (exact 2)
tensors: pass 4
nodes: pass 2
unmatched: A 0, B 0
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from probe.compare.load import Dump
from probe.ground.errors import ProbeError

__all__ = ["build_summary", "tolerance_rule", "write_result", "write_summary", "format_summary",
           "ResultWriter"]

_WORST_N = 5


def build_summary(con: Any, rows: pa.Table, nodes: pa.Table, da: Dump, db: Dump) -> dict[str, Any]:
    """The summary dict (matched/unmatched counts, labelled verdict counts, worst pairs, the
    inputs' fingerprints) of the tensor ``rows`` and the ``nodes`` (pyarrow.Tables, as
    :class:`~probe.compare.result.CompareResult` holds them) of dumps ``da`` and ``db``
    (:class:`~probe.compare.load.Dump`), queried on ``con``."""
    from probe.compare.tables import registered

    with registered(con, rows=rows, nodes=nodes):
        return _summary(con, da, db)


def _summary(con: Any, da: Any, db: Any) -> dict[str, Any]:
    from probe.compare.fingerprint import fingerprint
    from probe.compare.verdict import counts as verdict_counts

    def counts(sql: str) -> dict[str, int]:
        return {k: int(v) for k, v in con.execute(sql).fetchall() if k is not None}

    dtypes = [d for (d,) in con.execute(
        "select distinct d from (select dtype_a d from rows union select dtype_b from rows) "
        "where d is not null order by d").fetchall()]
    worst = con.execute(f"""
        select name_a, name_b, verdict, err, reason from rows
        where verdict in ('nan', 'error', 'warning') order by err desc nulls last, ord, row_id limit {_WORST_N}""").fetchall()
    node_cols = con.sql("select verdict, node_a, node_b from nodes").to_arrow_table()
    labelled = verdict_counts(con.sql("select verdict from rows").to_arrow_table().column(0),
                              *node_cols.columns)
    un_a, un_b = labelled["unmatched"]["a"], labelled["unmatched"]["b"]
    mode = "statistics"
    if da.task == "tensor" or db.task == "tensor":
        mode = "tensor"
    elif da.task == "md5" or db.task == "md5":
        mode = "md5"
    notes = [n for n in (da.note, db.note) if n]
    return {
        "a": da.source, "b": db.source, "framework_a": da.framework, "framework_b": db.framework,
        "mode": mode,
        "matched": node_cols.num_rows - labelled["nodes"]["unmatched"], "unmatched_a": un_a,
        "unmatched_b": un_b,
        "match_methods": counts("select match_method, count(*) from nodes group by all order by all"),
        "tensors": sum(labelled["tensors"].values()),
        "verdicts": {k: n for k, n in sorted(labelled["tensors"].items()) if n},
        "node_verdicts": {k: n for k, n in sorted(labelled["nodes"].items()) if n},
        "counts": labelled,
        "inputs": {"a": {"path": da.source, **fingerprint(da.source)},
                   "b": {"path": db.source, **fingerprint(db.source)}},
        "worst": [{"a": a, "b": b, "verdict": v, "err": e, "reason": r} for a, b, v, e, r in worst],
        "tolerance": tolerance_rule(dtypes),
        "notes": notes,
    }


def tolerance_rule(dtypes: list[str]) -> dict[str, Any]:
    """What pass, warning and error mean for each of ``dtypes`` (those the compare met), from
    :data:`probe.compare.verdict.TOLERANCES`: ``{"rule": <one line>, "dtypes": {dtype:
    {"pass": p, "warning": w}}}``.

    >>> print(tolerance_rule(["bfloat16", "float32"])["rule"])
    tolerance on err (each statistic's difference over its scale): bfloat16 pass <= 0.02, warning <= 0.08, error above; float32 pass <= 0.0001, warning <= 0.001, error above; nan: NaN/Inf on one side only
    """
    from probe.compare.verdict import tolerance

    bounds = {d: tolerance(d) for d in dtypes}
    parts = [f"{d} exact (pass only when equal, error otherwise)" if p == w == 0 else
             f"{d} pass <= {p:g}, warning <= {w:g}, error above" for d, (p, w) in bounds.items()]
    return {"rule": "tolerance on err (each statistic's difference over its scale): "
                    + "; ".join(parts + ["nan: NaN/Inf on one side only"]),
            "dtypes": {d: {"pass": p, "warning": w} for d, (p, w) in bounds.items()}}


def write_result(result: Any, out: Path) -> Path:
    """Write compare.csv, compare_msprobe.csv, compare.parquet, nodes.parquet and summary.json;
    return ``out``."""
    writer = ResultWriter(out)
    writer.rows(result.rows)
    writer.nodes(result.nodes)
    return writer.finish(result.summary)


#: the files of a compare result, in the order they are moved into place (summary.json last)
RESULT_FILES = ("compare.parquet", "nodes.parquet", "compare.csv", "compare_msprobe.csv", "summary.json")
#: the key of a result's id: in summary.json, and in the metadata of its Parquet files
#: (:func:`probe.compare.api.load_result` refuses parts of different compares)
RESULT_ID_KEY = "result_id"
#: temporary files of a result being written: ``.probe-tmp-<pid>-<name>``, beside the result
_TMP_PREFIX = ".probe-tmp-"


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before :func:`os.replace` moves it into place whole: a hidden
    name of this process in the same folder (one a later compare sweeps if this one is killed)."""
    path = Path(path)
    return path.with_name(f"{_TMP_PREFIX}{os.getpid()}-{path.name}")


def write_atomically(path: Path, write: Any) -> None:
    """``write(tmp)`` to :func:`temporary_name`, then moved to ``path`` in one rename; the
    temporary file is removed when ``write`` fails (``path`` is then as it was)."""
    tmp = temporary_name(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def sweep_temporaries(folder: Path) -> None:
    """Remove the temporary files of compares that died writing into ``folder`` (their process
    is gone); those of a live process are left to it."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not name.startswith(_TMP_PREFIX):
            continue
        pid, _, rest = name[len(_TMP_PREFIX):].partition("-")
        if pid.isdigit() and rest and not _alive(int(pid)):
            _unlink(Path(folder) / name)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` lives (:func:`probe.compare.load._alive`, the shm sweep's test)."""
    from probe.compare.load import _alive as alive

    return alive(pid)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class ResultWriter:
    """Writes a result's files as its parts become ready, on threads, while the rest is computed.

    :meth:`rows` starts compare.parquet (Arrow's Parquet writer releases the GIL) and
    compare.csv (Arrow's CSV writer holds it, which the DuckDB queries that run meanwhile do not
    need); :meth:`nodes` starts nodes.parquet; :meth:`finish` writes summary.json and waits.
    Every file is written under a temporary name (:func:`temporary_name`) and moved into place
    by :meth:`finish` once all of them are whole, summary.json last: a compare killed or failing
    midway leaves no file cut short, and :meth:`close` without :meth:`finish` removes what it
    wrote. The Parquet files and summary.json carry one id (:data:`RESULT_ID_KEY`), so a reader
    can tell parts of different compares apart.
    An unwritable folder is a one-line :class:`~probe.ground.errors.ProbeError`, raised by the call
    that found it or by :meth:`finish`.
    """

    def __init__(self, out: Path) -> None:
        import uuid
        from concurrent.futures import ThreadPoolExecutor

        self.out = Path(out)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ProbeError(f"{self.out}: cannot write the compare result ({e.strerror})") from None
        sweep_temporaries(self.out)
        self.result_id = uuid.uuid4().hex
        self._pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="compare-write")
        self._jobs: list[Any] = []
        self._written: list[str] = []       # names whose temporary file is being written

    def _tmp(self, name: str) -> Path:
        self._written.append(name)
        return temporary_name(self.out / name)

    def _tagged(self, table: Any) -> Any:
        meta = dict(table.schema.metadata or {})
        meta[RESULT_ID_KEY.encode()] = self.result_id.encode()
        return table.replace_schema_metadata(meta)

    def rows(self, rows: Any) -> None:
        from probe.compare.msprobe_csv import write_msprobe_csv

        self._jobs += [self._pool.submit(_write_parquet, self._tagged(rows), self._tmp("compare.parquet")),
                       self._pool.submit(_write_csv, rows, self._tmp("compare.csv")),
                       self._pool.submit(write_msprobe_csv, rows, self._tmp("compare_msprobe.csv"))]

    def nodes(self, nodes: Any) -> None:
        self._jobs.append(self._pool.submit(_write_parquet, self._tagged(nodes), self._tmp("nodes.parquet")))

    def finish(self, summary: dict[str, Any]) -> Path:
        done = False
        try:
            for job in self._jobs:
                job.result()
            summary[RESULT_ID_KEY] = self.result_id
            _write_summary_to(summary, self._tmp("summary.json"))
            for name in sorted(self._written, key=RESULT_FILES.index):
                os.replace(temporary_name(self.out / name), self.out / name)
            done = True
        except OSError as e:
            from probe.ground.files import disk_full, is_disk_full

            if is_disk_full(e):
                raise disk_full(self.out, e) from None
            raise ProbeError(f"{self.out}: cannot write the compare result ({e.strerror})") from None
        finally:
            self.close(keep=done)
        return self.out

    def close(self, keep: bool = False) -> None:
        """Stop the writing threads; without ``keep`` (a compare that failed or was
        interrupted) remove the temporary files written."""
        self._pool.shutdown(wait=True)
        if not keep:
            for name in self._written:
                _unlink(temporary_name(self.out / name))
        self._written = []


def write_summary(summary: dict[str, Any], out: Path) -> None:
    """Write ``out/summary.json`` (strict JSON: non-finite numbers as strings), whole or not at
    all (:func:`write_atomically`)."""
    write_atomically(Path(out) / "summary.json", lambda tmp: _write_summary_to(summary, tmp))


def _write_summary_to(summary: dict[str, Any], path: Path) -> None:
    Path(path).write_text(json.dumps(_json_safe(summary), indent=1, default=str, allow_nan=False) + "\n")


#: String columns with few distinct values: dictionary-encoded in Parquet (names are not:
#: dictionary encoding of 100k distinct strings costs more than it saves).
_DICT_COLUMNS = ("direction", "slot", "index", "match_method", "dtype_a", "dtype_b", "verdict",
                 "reason", "kind", "class_a", "class_b", "in_verdict", "out_verdict",
                 "param_verdict", "precision_band")


def _write_parquet(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path, use_dictionary=[c for c in _DICT_COLUMNS if c in table.column_names])


def _json_safe(x: Any) -> Any:
    """Non-finite floats become the strings "inf", "-inf", "nan" (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


#: Rows per chunk of compare.csv formatted on its own thread (Arrow's CSV writer releases the
#: GIL; formatting the floats is most of the cost of the file). Small chunks keep each
#: formatted buffer a few MB, which the allocator reuses instead of faulting in fresh pages
#: (100k entries: 0.38-0.52 s at 8k rows a chunk, 0.59-0.69 s at 32k).
CSV_CHUNK_ROWS = 8_192
#: Rows from which compare.csv is formatted in parallel chunks, on a machine of at least
#: CSV_PARALLEL_CORES cores. Otherwise one thread writes it while the node queries and the
#: Parquet files take the other core (chunking costs 10-30% more CPU, which only spare cores
#: win back: 266k rows take 0.70 s CPU in one piece, 0.77-0.89 s in chunks).
CSV_PARALLEL_ROWS = 131_072
CSV_PARALLEL_CORES = 4
#: Cores from which compare.csv, formatted natively (:mod:`probe.compare.csv_native`, which costs
#: little more CPU in chunks), is formatted on as many threads: the file is the last part of a
#: large compare to finish, and the other core is free once the node rows are done (100k
#: entries, 2 shared cores, medians of alternating runs in three sessions: 2.59, 2.98, 3.62 ->
#: 2.08, 2.95, 3.44 s; CPU 0.0-0.2 s more).
CSV_NATIVE_PARALLEL_CORES = 2


def _write_csv(rows: Any, path: Path) -> None:
    """CSV of the rows, list columns (shapes) as ``[2, 4]`` text; all vectorised in Arrow, the
    text formatted by :mod:`probe.compare.csv_native` where it can (Arrow's writer's bytes, in half
    its CPU time: 100k entries, 0.64-0.88 -> 0.42-0.49 s; the shapes' text too), else by
    Arrow's writer.

    Large tables (:data:`CSV_PARALLEL_ROWS`) on a machine with cores to spare
    (:data:`CSV_NATIVE_PARALLEL_CORES` natively, :data:`CSV_PARALLEL_CORES` by Arrow) are
    formatted in chunks on as many threads as there are cores, a few chunks ahead of the one
    being written, and written in order (the header once).
    """
    import itertools
    import os
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    from probe.compare.csv_native import write_csv

    workers = min(os.cpu_count() or 1, 8)
    big = rows.num_rows >= CSV_PARALLEL_ROWS
    native = workers if big and workers >= CSV_NATIVE_PARALLEL_CORES else 1
    # the same bytes, formatted natively (list<int64> shapes too: 0.09 s of Arrow at 100k)
    if write_csv(rows, path, native):
        return
    flat = rows
    for i, f in enumerate(rows.schema):
        if pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            text = pc.binary_join(pc.cast(rows.column(i), pa.list_(pa.string())), ", ")
            flat = flat.set_column(i, f.name, pc.binary_join_element_wise("[", text, "]", ""))
    if write_csv(flat, path, native):
        return
    parallel = workers >= CSV_PARALLEL_CORES and big
    if not parallel:
        pcsv.write_csv(flat, path)
        return

    def chunk(start: int) -> Any:
        sink = pa.BufferOutputStream()
        pcsv.write_csv(flat.slice(start, CSV_CHUNK_ROWS), sink,
                       write_options=pcsv.WriteOptions(include_header=start == 0))
        return sink.getvalue()
    starts = iter(range(0, flat.num_rows, CSV_CHUNK_ROWS))
    with open(path, "wb") as f, ThreadPoolExecutor(workers, thread_name_prefix="compare-csv") as pool:
        ahead = [pool.submit(chunk, s) for s in itertools.islice(starts, 2 * workers)]
        while ahead:
            f.write(ahead.pop(0).result())
            nxt = next(starts, None)
            if nxt is not None:
                ahead.append(pool.submit(chunk, nxt))


def _short(name: str | None, width: int = 70) -> str:
    if name is None:
        return "-"
    return name if len(name) <= width else "…" + name[-(width - 1):]


def format_summary(s: dict[str, Any]) -> str:
    """The terminal summary: the labelled counts, the first divergence, the first NaN, the
    worst pairs."""
    from probe.compare.verdict import format_counts

    methods = ", ".join(f"{k} {v}" for k, v in s.get("match_methods", {}).items() if k != "unmatched")
    lines = [f"compare {s.get('a')}  vs  {s.get('b')}",
             f"matched {s['matched']} nodes ({methods or 'none'})",
             format_counts(s["counts"])]
    if s.get("tolerance"):
        lines.append(s["tolerance"]["rule"])
    for key, label in (("first_divergence", "first divergence"), ("first_nan", "first NaN/Inf")):
        f = s.get(key)
        if f:
            lines.append(f"{label} ({f['direction']}): {_short(f['a'])}  <->  {_short(f['b'])}")
            if f.get("reason"):
                lines.append(f"    {f['reason']}")
        else:
            lines.append(f"{label}: none")
    if s.get("worst"):
        lines.append("worst pairs:")
        for w in s["worst"]:
            lines.append(f"  {w['verdict']:7s} {_short(w['a'] or w['b'], 60)}: {w['reason']}")
    for n in s.get("notes", []):
        lines.append(f"note: {n}")
    return "\n".join(lines)
