"""The record store: Parquet segments written as a run goes, read back as DuckDB views.

Layout under a run directory::

    RUN/store/<kind>/rank<R>/seg-<pid>-<writer>-<n>.parquet

A :class:`StoreWriter` buffers Arrow tables per record kind and writes a segment when a step
ends (:meth:`StoreWriter.end_step`) or when its buffer passes ``max_buffer_rows``. Each segment
is written to a temporary name and renamed, so a reader never sees half a file and a crash or
``kill -9`` loses at most the step in flight. With ``fsync="step"`` (the default) every
segment of a finished step is also forced to disk, file and folder, by a background thread right
after the step ends (the training thread does not wait for the disk; :meth:`StoreWriter.close`
does), so a power loss too loses at most the last step; ``fsync="never"`` leaves that to the
operating system. :func:`open_store` exposes every segment under a
directory as the views ``tensors``, ``nodes``, ``events``, ``metrics`` and ``steps`` (the
engine's per-step metrics pivoted to one row per rank and step). A segment whose Parquet footer
cannot be read (a disk fault, a file copied in half) is left out of the views with one warning on
stderr naming it; the rest of the store stays readable.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> w = StoreWriter(d, rank=0, run="demo")
>>> w.write_rows("metric", [{"time_ns": 1, "job": "demo", "rank": 0, "step": 0,
...                          "name": "loss", "value": 2.0}])
>>> w.end_step(0); w.close()
>>> open_store(d).sql("select step, loss from steps").fetchall()
[(0, 2.0)]
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
import threading
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from probe.collectors.records import SCHEMAS, VIEWS, conform, schema_for, table_from_rows
from probe.ground.background import BackgroundQueue
from probe.ground.errors import ProbeError
from probe.ground.files import disk_full, is_disk_full

log = logging.getLogger(__name__)

STORE_DIRNAME = "store"


class StoreWriter:
    """Streams records of one rank to Parquet segments; thread-safe; bounded memory."""

    def __init__(self, run_dir: str | os.PathLike, rank: int = 0, run: str | None = None,
                 *, max_buffer_rows: int = 200_000, fsync: str = "step") -> None:
        self.run_dir = Path(run_dir)
        self.rank = int(rank)
        self.run = run if run is not None else self.run_dir.name
        self.max_buffer_rows = max_buffer_rows
        if fsync not in FSYNC_MODES:
            raise ProbeError(f"--fsync {fsync!r}: use one of {', '.join(FSYNC_MODES)}")
        self.fsync = fsync
        self._syncer: BackgroundQueue | None = None
        self._buffers: dict[str, list[pa.Table]] = {k: [] for k in SCHEMAS}
        self._rows: dict[str, int] = {k: 0 for k in SCHEMAS}
        self._counter = itertools.count()
        self._writer_id = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._closed = False
        self.segments_written = 0
        try:
            (self.run_dir / STORE_DIRNAME).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ProbeError(f"{self.run_dir}: cannot create the record store ({e.strerror})") from None

    def write(self, kind: str, table: pa.Table | pa.RecordBatch) -> None:
        """Buffer a table of ``kind``; spills a segment when the buffer is full."""
        table = conform(kind, table)
        if table.num_rows == 0:
            return
        with self._lock:
            if self._closed:
                raise RuntimeError("StoreWriter is closed")
            self._buffers[kind].append(table)
            self._rows[kind] += table.num_rows
            if self._rows[kind] >= self.max_buffer_rows:
                self._flush_kind(kind)

    def write_rows(self, kind: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Buffer dict rows of ``kind`` (missing fields are null)."""
        self.write(kind, table_from_rows(kind, rows))

    def end_step(self, step: int | None = None) -> None:  # noqa: ARG002 - step kept for callers' clarity
        """Make everything buffered so far durable (one segment per kind with rows)."""
        with self._lock:
            for kind in SCHEMAS:
                self._flush_kind(kind)

    flush = end_step

    def close(self) -> None:
        """Flush and stop accepting records. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            for kind in SCHEMAS:
                self._flush_kind(kind)
            self._closed = True
        if self._syncer is not None:
            self._syncer.close()

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flush_kind(self, kind: str) -> None:
        tables = self._buffers[kind]
        if not tables:
            return
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        self._buffers[kind] = []
        self._rows[kind] = 0
        folder = self.run_dir / STORE_DIRNAME / kind / f"rank{self.rank}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"seg-{os.getpid()}-{self._writer_id}-{next(self._counter):08d}.parquet"
        tmp = folder / (".tmp-" + name)
        # snappy: a third of zstd's CPU time for segments about 15% larger; the writer shares
        # the machine with the training it records
        try:
            pq.write_table(table, tmp, compression="snappy")
            os.replace(tmp, folder / name)
        except OSError as e:         # no half-written segment is left; a full disk is one line
            tmp.unlink(missing_ok=True)
            if is_disk_full(e):
                raise disk_full(self.run_dir / STORE_DIRNAME, e) from None
            raise
        self.segments_written += 1
        if self.fsync == "step":
            if self._syncer is None:
                self._syncer = BackgroundQueue(_fsync_all, name=f"store-fsync-r{self.rank}",
                                               capacity=4096, overflow="block",
                                               on_error=_warn_fsync)
            self._syncer.put(folder / name)

    def sync(self, timeout: float | None = None) -> bool:
        """Wait until every segment written so far is on disk (``fsync="step"``)."""
        return self._syncer.flush(timeout) if self._syncer is not None else True


#: ``--fsync`` values: ``step`` forces each finished step's segments to disk; ``never`` does not.
FSYNC_MODES = ("step", "never")


def _fsync_all(paths: list[Path]) -> None:
    """fsync each file, then each folder once (the rename that made the file visible)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in {p.parent for p in paths}:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _warn_fsync(error: BaseException) -> None:
    log.warning(f"probe: store: could not force a segment to disk ({type(error).__name__}: {error})")


def find_segments(root: str | os.PathLike) -> dict[str, list[str]]:
    """All finished segment files under ``root`` (any depth), per record kind."""
    root = Path(root)
    found: dict[str, list[str]] = {k: [] for k in SCHEMAS}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        parts = Path(dirpath).parts
        if len(parts) >= 3 and parts[-3] == STORE_DIRNAME and parts[-2] in found:
            kind = parts[-2]
            found[kind].extend(os.path.join(dirpath, f) for f in sorted(filenames)
                               if f.endswith(".parquet") and not f.startswith("."))
    return found


STEPS_VIEW = """
CREATE OR REPLACE VIEW steps AS
SELECT job AS run, rank, step,
       max(CASE WHEN name = 'loss' THEN value END) AS loss,
       max(CASE WHEN name = 'step_time_ms' THEN value END) AS step_time_ms,
       max(CASE WHEN name = 'tokens_per_s' THEN value END) AS tokens_per_s,
       max(CASE WHEN name = 'grad_norm' THEN value END) AS grad_norm,
       max(CASE WHEN name = 'compute_time_ms' THEN value END) AS compute_time_ms,
       max(CASE WHEN name = 'compute_cpu_ms' THEN value END) AS compute_cpu_ms,
       max(CASE WHEN name = 'comm_time_ms' THEN value END) AS comm_time_ms,
       max(CASE WHEN name = 'data_time_ms' THEN value END) AS data_time_ms,
       min(time_ns) AS time_ns
FROM metrics GROUP BY job, rank, step
"""


_checked: dict[str, tuple[tuple[int, int], str | None]] = {}
_warned: set[str] = set()


def segment_problem(path: str) -> str | None:
    """Why the segment at ``path`` cannot be read, or None when its Parquet footer is sound.

    Reads only the footer, and only once per file size and modification time (segments are
    immutable once written, and the live page reopens the store every few seconds).

    >>> segment_problem("/nonexistent.parquet")
    'No such file or directory'
    """
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror
    if not stat.S_ISREG(st.st_mode):   # a FIFO would block the footer's read; a device never ends
        return "not a regular file"
    key = (st.st_size, st.st_mtime_ns)
    seen = _checked.get(path)
    if seen is not None and seen[0] == key:
        return seen[1]
    try:
        pq.read_metadata(path)
        problem = None
    except (OSError, ValueError, pa.ArrowException) as e:
        problem = str(e).splitlines()[0] if str(e) else type(e).__name__
    _checked[path] = (key, problem)
    return problem


def load_segments(root: str | os.PathLike) -> tuple[dict[str, list[str]], list[str]]:
    """The readable segments under the run directory ``root`` per record kind, and one line per
    segment left out (each also warned once on stderr).

    ``ProbeError`` when ``root`` is not a run directory or holds no store at all.
    """
    root = Path(root)
    if not root.exists():
        raise ProbeError(f"{root}: no such run directory")
    if not root.is_dir():
        raise ProbeError(f"{root}: not a directory; give a run directory that holds a '{STORE_DIRNAME}/' folder")
    segments = find_segments(root)
    if not any(segments.values()):
        raise ProbeError(f"{root}: no record store found (expected {STORE_DIRNAME}/<kind>/rank<R>/*.parquet "
                         "under it); give the --out directory of a probe run")
    good: dict[str, list[str]] = {}
    skipped: list[str] = []
    for kind, files in segments.items():
        good[kind] = []
        for f in files:
            problem = segment_problem(f)
            if problem is None:
                good[kind].append(f)
                continue
            skipped.append(f"{f}: {problem}")
            if f not in _warned:
                _warned.add(f)
                log.warning(f"probe: warning: {f}: not a readable Parquet segment ({problem}); skipped, "
                            "the rest of the store is read")
    return good, skipped


def create_views(con: Any, segments: Mapping[str, list[str]], root: str | os.PathLike) -> Any:
    """Create the store's views on the DuckDB connection ``con`` over ``segments`` (per record
    kind, as :func:`load_segments` gives them); ``root`` names the store in errors."""
    import duckdb

    try:
        for kind in SCHEMAS:
            view, files = VIEWS[kind], segments.get(kind, [])
            if files:
                file_list = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
                con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM read_parquet([{file_list}], "
                            "union_by_name = true)")
            else:
                con.register(f"_empty_{view}", schema_for(kind).empty_table())
                con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM _empty_{view}")
        con.execute(STEPS_VIEW)
    except duckdb.Error as e:
        raise ProbeError(f"{root}: cannot read the record store ({str(e).splitlines()[0]})") from None
    return con


def open_store(root: str | os.PathLike, con: Any = None) -> Any:
    """A DuckDB connection with views over every readable record segment found under ``root``.

    Views: ``tensors``, ``nodes``, ``events``, ``metrics`` (one per record kind, empty when a
    kind has no records) and ``steps`` (per-step engine metrics pivoted: run, rank, step, loss,
    step_time_ms, tokens_per_s, grad_norm). Unreadable segments are skipped with a warning.
    """
    import duckdb

    segments, _ = load_segments(root)
    return create_views(con or duckdb.connect(), segments, root)


def read_step(root: str | os.PathLike, step: int | None = None, rank: int | None = None,
              con: Any = None) -> tuple[pa.Table, pa.Table, int | None, int | None]:
    """The tensor and node records of one step and rank in the store under ``root`` (the lowest
    step and rank when not given), each node once: ``(tensors, nodes, step, rank)``.

    ``con``: a connection from :func:`open_store` to reuse.

    >>> tensors, nodes, step, rank = read_step("runs/demo", step=2)       # doctest: +SKIP
    """
    con = con if con is not None else open_store(root)
    if not con.sql("select count(*) from tensors").fetchall()[0][0]:
        raise ProbeError(f"{root}: the store holds no tensor records; run 'probe dump' first")
    if step is None:
        step = con.sql("select min(step) from tensors"
                       + (f" where rank = {int(rank)}" if rank is not None else "")).fetchall()[0][0]
    if rank is None:
        rank = con.sql("select min(rank) from tensors"
                       + (f" where step = {int(step)}" if step is not None else "")).fetchall()[0][0]
    cond = [f"{col} = {int(v)}" for col, v in (("step", step), ("rank", rank)) if v is not None]
    where = (" where " + " and ".join(cond)) if cond else ""
    tensors = con.sql(f"select * from tensors{where} order by seq").to_arrow_table()
    if not tensors.num_rows:
        raise ProbeError(f"{root}: the store holds no tensor records of step {step} rank {rank}")
    nwhere = f" where rank = {int(rank)}" if rank is not None else ""
    nodes = con.sql(f"select * from nodes{nwhere} qualify row_number() over "
                    "(partition by node order by \"order\") = 1 order by \"order\"").to_arrow_table()
    return conform("tensor", tensors), conform("node", nodes), step, rank
