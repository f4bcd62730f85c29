"""The compare pipeline over two loaded dumps: normalise → match → metrics → verdicts → localise.

Each stage is a function that takes and returns pyarrow.Tables or small dataclasses of them;
this module is the chain of calls (:func:`_finish`), with the two sides overlapped:

1. :func:`probe.compare.normalise.normalise_side` (records → :class:`~probe.compare.normalise.Side`),
   once per side;
2. :func:`probe.compare.mapping.mapped_pairs` (two sides' groups, a mapping file → pairs), with
   ``--mapping``;
3. :func:`probe.compare.match.match_groups` (two sides → :class:`~probe.compare.match.Matches`);
4. :func:`probe.compare.node_rows.node_frame` (groups, matches → :class:`~probe.compare.node_rows.NodeFrame`),
   on a cursor of its own while the next step runs;
5. :func:`probe.compare.tensor_rows.tensor_rows` (two sides, matches → tensor rows), then
   :func:`~probe.compare.tensor_rows.with_names` and, for tensor-mode dumps,
   :func:`probe.compare.metrics.add_tensor_metrics` (rows → rows);
6. :func:`probe.compare.node_rows.node_rows` (rows, groups, matches, frame → node rows), then
   :func:`probe.compare.localise.with_impact` (node rows → node rows);
7. :func:`probe.compare.report.build_summary` and :func:`probe.compare.localise.localise`
   (rows, node rows → the summary).

Everything row-wise is a DuckDB query over Arrow tables, which a stage registers on the
connection it is given for as long as it runs (zero-copy; :func:`probe.compare.tables.registered`):
no stage reads a table another left behind. Python touches only the groups left unmatched by
name (structural alignment) and the tensor files of tensor-mode dumps.

>>> from probe.compare.load import load_dump                                  # doctest: +SKIP
>>> r = run_compare(load_dump("A/dump.json"), load_dump("B/dump.json"))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from probe.compare.load import Dump
from probe.compare.result import CompareResult

__all__ = ["run_compare", "compare_paths"]


def run_compare(da: Dump, db: Dump, mapping: str | None = None, bar: Any = None,
                out: Any = None) -> CompareResult:
    """Compare two loaded dumps; see :mod:`probe.compare.result` for the result's columns. With ``out``
    (a folder) the result files are written there as their parts are ready."""
    con = _connect()
    side_a = _Normaliser(con, da).start()
    try:
        side_b = _Normaliser(con, db)
        side_b.run()
    finally:
        side_a.join()
    _tick(bar, "normalised")
    return _finish(con, (side_a, side_b), mapping, bar, out)


def compare_paths(a: str, b: str, mapping: str | None = None, bar: Any = None,
                  out: Any = None, parallel: bool = True) -> CompareResult:
    """Read and compare two inputs, overlapping the work of the two sides on two cores.

    B is read in a worker process when the inputs are large (:func:`probe.compare.load.start_load`)
    and normalised there too (:func:`_prepare_b`), while A is read here and its records
    normalised on a DuckDB cursor in a thread (DuckDB runs without the GIL). Errors are A's first, then B's. ``parallel=False``: all
    of it one step after another in this thread (for a pool that compares many pairs at once,
    one per core: the same result).
    """
    from probe.compare.load import load_dump, start_load

    pending = start_load(a, b, fork=parallel, prepare=_prepare_b)
    side_a = None
    try:
        if parallel:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1, thread_name_prefix="compare-connect") as pool:
                connecting = pool.submit(_connect)   # while A is read (the scanner frees the GIL)
                dump = load_dump(a)
                _tick(bar, "read A")
                con = connecting.result()
        else:
            dump = load_dump(a)
            _tick(bar, "read A")
            con = _connect()
        side_a = _Normaliser(con, dump)
        if parallel:
            side_a.start()
        else:
            side_a.run()
        if parallel and pending.forked:
            # A's tensor names while B's worker reads and normalises B, the longer of the two
            # (100k entries: ~0.1 s CPU out of the busy part after B arrives, where every
            # core is taken)
            from probe.compare.tensor_rows import tensor_names

            side_a.names = tensor_names(dump.tensors)
        dump, made = pending.result_prepared()
        _tick(bar, "read B")
        if made is not None:                         # normalised by the worker that read it
            side_b = _Prepared(dump, made)
        else:
            side_b = _Normaliser(con, dump)
        del dump, made                               # the sides hold the records, and let go
        side_b.run()
    finally:
        pending.close()
        if side_a is not None:
            side_a.join()
    _tick(bar, "normalised")
    return _finish(con, (side_a, side_b), mapping, bar, out, parallel)


#: Tensor rows of both sides together from which DuckDB runs each query on every core. Below
#: it a query runs on one thread (a table of fewer rows than a few row groups of 122,880 gains
#: less from DuckDB's threads than their coordination costs) and the parallelism is ours: the
#: two sides normalised at once, the rows query in two halves.
DUCKDB_PARALLEL_ROWS = 1_000_000


def _connect() -> Any:
    """The compare's in-memory DuckDB, one thread per query until :func:`_size_threads`."""
    import duckdb

    return duckdb.connect(config={"threads": 1})


def _size_threads(con: Any, rows: int) -> int:
    """Give DuckDB every core when the inputs are large; returns its thread count."""
    threads = os.cpu_count() or 1
    if rows >= DUCKDB_PARALLEL_ROWS and threads > 1:
        con.execute(f"set threads = {threads}")
        return threads
    return 1


def _prepare_b(dump: Dump) -> dict:
    """In the worker that read B (:func:`probe.compare.load.start_load`): what the compare needs of
    B, made there on its own core while A is read and normalised here: B's tensor table and
    call groups (:func:`probe.compare.normalise.normalise_side` on a DuckDB of its own), its tensor
    names (:func:`probe.compare.tensor_rows.tensor_names`) and its record count. The records
    themselves then stay in the worker (100k entries: B's normalising, 0.3-0.7 s, leaves the
    critical path)."""
    import pyarrow as pa

    from probe.compare.normalise import normalise_side
    from probe.compare.tensor_rows import tensor_names

    con = _connect()
    try:
        side = normalise_side(con, dump.tensors, dump.nodes)
    finally:
        con.close()
    name, node = tensor_names(dump.tensors)
    return {"t": side.tensors, "g": side.groups, "names": pa.table({"name": name, "node": node}),
            "rows": dump.tensors.num_rows}


class _Prepared:
    """A side normalised by the worker that read it (:func:`_prepare_b`), held as
    :class:`_Normaliser` holds a side it normalised (nothing left to run)."""

    def __init__(self, dump: Dump, made: dict) -> None:
        from probe.compare.normalise import Side

        self.dump = dump
        self.side: Any = Side(groups=made["g"], tensors=made["t"])
        self.rows = made["rows"]
        names = made["names"]
        self.names = tuple(_one_array(names.column(k)) for k in ("name", "node"))

    def run(self) -> None:
        pass

    def join(self) -> None:
        pass

    def release(self) -> tuple[Dump, Any, Any]:
        """As :meth:`_Normaliser.release` (no records: the names were taken before)."""
        dump, side = self.dump, self.side
        self.dump = self.side = self.names = None
        return dump, None, side


class _Normaliser:
    """:func:`probe.compare.normalise.normalise_side` of one side on its own cursor, here or in a thread."""

    def __init__(self, con: Any, dump: Dump) -> None:
        self.cursor = con.cursor()
        self.dump = dump
        self.thread: Any = None
        self.error: BaseException | None = None
        self.side: Any = None                   # the normalised side, once run
        self.names: Any = None                  # its tensor names, when made before _finish

    def run(self) -> None:
        from probe.compare.normalise import normalise_side

        try:
            self.side = normalise_side(self.cursor, self.dump.tensors, self.dump.nodes)
        finally:
            self.cursor.close()

    def _run_caught(self) -> None:
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 - re-raised by join() on the caller's thread
            self.error = e

    def start(self) -> "_Normaliser":
        import threading

        self.thread = threading.Thread(target=self._run_caught, name="normalise", daemon=True)
        self.thread.start()
        return self

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error

    def release(self) -> tuple[Dump, Any, Any]:
        """(the dump without its tables, its tensor records, its :class:`~probe.compare.normalise.Side`),
        no longer held here: the compare lets each go as soon as it is done with it."""
        from dataclasses import replace

        dump, side = self.dump, self.side
        self.dump = self.side = self.names = None
        return replace(dump, tensors=None, nodes=None), dump.tensors, side


def _finish(con: Any, sides: tuple, mapping: str | None, bar: Any, out: Any = None,
            parallel: bool = True) -> CompareResult:
    """Match, metrics, verdicts and localisation over the two normalised sides (``sides``: their
    :class:`_Normaliser` or :class:`_Prepared`, run): the chain of stages of the module
    docstring. The result's files are written to ``out`` (when given) while the later parts are
    computed. Each side's records and tensor table are let go once the tensor rows hold what
    they need of them. ``parallel=False``: the names, the node frame and the rows on this
    thread only."""
    from concurrent.futures import ThreadPoolExecutor

    from probe.compare.localise import localise, with_impact
    from probe.compare.match import match_groups
    from probe.compare.metrics import add_tensor_metrics
    from probe.compare.node_rows import node_frame, node_rows
    from probe.compare.report import ResultWriter, build_summary
    from probe.compare.tensor_rows import HELPER_COLUMNS, PARTITION_ROWS, tensor_names, tensor_rows, with_names

    made = [getattr(side, "names", None) for side in sides]       # a prepared side's names
    n = sum(getattr(side, "rows", 0) for side in sides)
    (da, records_a, side_a), (db, records_b, side_b) = (side.release() for side in sides)
    n += sum(r.num_rows for r in (records_a, records_b) if r is not None)
    writer = ResultWriter(out) if out is not None else None
    # both sides' tensor names are built in Arrow (no GIL) while the matching runs in DuckDB
    if parallel:
        naming = ThreadPoolExecutor(2, thread_name_prefix="compare-names")
        names_a, names_b = (_done(m) if m is not None else naming.submit(tensor_names, r)
                            for m, r in zip(made, (records_a, records_b)))
        naming.shutdown(wait=False)
    else:
        names_a, names_b = (_done(m if m is not None else tensor_names(r))
                            for m, r in zip(made, (records_a, records_b)))
    del made
    del records_a, records_b
    groups_a, groups_b = side_a.groups, side_b.groups
    try:
        mapped = None
        if mapping:
            from probe.compare.mapping import mapped_pairs

            mapped = mapped_pairs(groups_a, groups_b, mapping)
        matches = match_groups(con, side_a, side_b, mapped, structural=mapped is None)
        _tick(bar, "matched")
        # the node tables that need only the matched groups, on a cursor of their own while the
        # tensor rows are built (100k entries: 0.08 s off the node rows' critical path)
        framing = (_cursor_job(con, lambda cursor: node_frame(cursor, groups_a, groups_b, matches))
                   if parallel else _done(node_frame(con, groups_a, groups_b, matches)))
        single = not parallel or _size_threads(con, n) == 1
        halves = parallel and single and n >= PARTITION_ROWS and (os.cpu_count() or 1) >= 2
        full = tensor_rows(con, side_a, side_b, matches, 2 if halves else 1)
        del side_a, side_b
        full = with_names(full, (names_a.result(), names_b.result()))
        names_a = names_b = None
        rows = full.drop_columns(list(HELPER_COLUMNS))
        if da.task == "tensor" or db.task == "tensor":
            rows = add_tensor_metrics(rows, progress=bar is not None and getattr(bar, "enabled", False),
                                      settled=full.column("settled"))
            for k in ("err", "verdict", "reason"):
                full = full.set_column(full.schema.get_field_index(k), k, rows.column(k))
        if writer is not None:
            writer.rows(rows)
        _tick(bar, "metrics")
        nodes = with_impact(con, node_rows(con, full, groups_a, groups_b, matches, framing.result()))
        del full
        if writer is not None:
            writer.nodes(nodes)
        _tick(bar, "verdicts")
        summary = build_summary(con, rows, nodes, da, db)
        summary.update(localise(con, nodes))
        _tick(bar, "localised")
        con.close()
        result = CompareResult(rows=rows, nodes=nodes, summary=summary)
        if writer is not None:
            result.written = writer.finish(summary)
            writer = None
        return result
    finally:
        if writer is not None:
            writer.close()


def _cursor_job(con: Any, job: Any) -> Any:
    """``job(cursor)`` on a new cursor of ``con`` in a thread (DuckDB runs without the GIL): a
    future of its result; the cursor is closed when it is done."""
    from concurrent.futures import ThreadPoolExecutor

    cursor = con.cursor()

    def run() -> Any:
        try:
            return job(cursor)
        finally:
            cursor.close()
    pool = ThreadPoolExecutor(1, thread_name_prefix="compare-frame")
    try:
        return pool.submit(run)
    finally:
        pool.shutdown(wait=False)


def _one_array(col: Any) -> Any:
    """A column as one array: its chunk when it has one (combining copies even then, and these
    are mapped from the worker's files: 100k entries, 23 MB of names not held twice)."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _done(value: Any) -> Any:
    """A finished future holding ``value``."""
    from concurrent.futures import Future

    f: Future = Future()
    f.set_result(value)
    return f


def _tick(bar: Any, what: str) -> None:
    if bar is not None:
        bar.step(what)
