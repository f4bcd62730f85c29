"""Untrusted SQL over a run's record store: one SELECT, the run's own files only, bounded.

The web's Query page and ``probe query --safe`` run SQL that someone else typed. DuckDB can read
and write any file the process can (``read_text``, ``COPY ... TO``, ``ATTACH``), load extensions
and change its own settings; here it can do none of that:

1. Find the readable segments of the store (:func:`probe.collectors.store.load_segments`) and create
   the views over them on a fresh in-memory DuckDB, with absolute paths.
2. Allow file reads only in the folders that hold those segments (``allowed_directories``), then
   turn external access off (no other file, no network, no ``ATTACH``, no ``INSTALL``/``LOAD`` of
   extensions from disk), turn off extension auto-install/auto-load and spilling to disk (no
   temporary directory at all: DuckDB would add its default ``<cwd>/.tmp`` to the readable
   folders), cap its memory, and lock the configuration so no ``SET``/``PRAGMA`` can undo any of it.
3. Refuse SQL longer than ``max_sql_chars`` before parsing it; parse the SQL with DuckDB's own parser and refuse anything but a single ``SELECT`` (``WITH``,
   ``DESCRIBE``, ``SUMMARIZE``, ``FROM t`` are selects) or ``EXPLAIN``: no ``COPY``, ``CREATE``,
   ``INSERT``, ``EXPORT``, ``CALL``, ``PRAGMA``, ``SET``, ``LOAD`` or ``ATTACH``.
4. Run it with a timer thread that interrupts the query after ``timeout_s`` seconds, and fetch at
   most ``max_rows`` rows (one more is read to tell that there were more).

>>> run_untrusted("runs/demo", "select count(*) from steps").rows     # doctest: +SKIP
[(12,)]
>>> run_untrusted("runs/demo", "select * from read_text('/etc/hostname')")  # doctest: +SKIP
Traceback (most recent call last):
probe.ground.errors.ProbeError: SQL refused: Permission Error: Cannot access file "/etc/hostname" ...
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.collectors.store import create_views, load_segments
from probe.ground.errors import ProbeError

ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")


@dataclass(frozen=True)
class Limits:
    """What one untrusted query may use: rows returned, seconds of run time, DuckDB memory, and
    the length of its text."""

    max_rows: int = 2000
    timeout_s: float = 10.0
    memory: str = "1GB"
    max_sql_chars: int = 100_000

    def describe(self) -> str:
        """The limits in words, for the page and the command's help."""
        return (f"one SELECT over this run's views; no other file, network, extension or setting; "
                f"at most {self.max_sql_chars} characters of SQL, {self.max_rows} rows, "
                f"{self.timeout_s:g} s and {self.memory} of memory a query")


@dataclass
class QueryResult:
    """Columns and rows of a query; ``truncated`` when it had more than the row limit;
    ``skipped``: the store's unreadable segments that were left out, one line each."""

    columns: list[str]
    rows: list[tuple]
    truncated: bool = False
    skipped: list[str] = field(default_factory=list)


def open_sandbox(root: str | os.PathLike, limits: Limits = Limits()) -> tuple[Any, list[str]]:
    """A locked DuckDB connection with the store's views over the run directory ``root``, and
    the unreadable segments left out (steps 1 and 2 of the module docstring)."""
    import duckdb

    segments, skipped = load_segments(Path(root).resolve())
    con = duckdb.connect(":memory:", config={"memory_limit": limits.memory,
                                             "max_temp_directory_size": "0KiB",
                                             "temp_directory": "",
                                             "autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    try:
        create_views(con, segments, root)
        folders = sorted({os.path.dirname(f) + os.sep for files in segments.values() for f in files})
        con.execute("SET allowed_directories = $folders", {"folders": folders})
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con, skipped


def check_statement(sql: str) -> None:
    """Refuse (``ProbeError``) anything but one SELECT or EXPLAIN statement.

    >>> check_statement("select 1")
    >>> check_statement("copy (select 1) to 'x.csv'")
    Traceback (most recent call last):
    ...
    probe.ground.errors.ProbeError: SQL refused: only a single SELECT (or EXPLAIN) runs here, not COPY
    """
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise ProbeError(f"SQL error: {str(e).splitlines()[0]}") from None
    if not statements:
        raise ProbeError("SQL refused: no statement given")
    if len(statements) > 1:
        raise ProbeError(f"SQL refused: one statement at a time ({len(statements)} given)")
    kind = statements[0].type.name
    if kind not in ALLOWED_STATEMENTS:
        raise ProbeError(f"SQL refused: only a single SELECT (or EXPLAIN) runs here, not {kind}")


def run_untrusted(root: str | os.PathLike, sql: str, limits: Limits = Limits()) -> QueryResult:
    """Run ``sql`` from an untrusted author over the store under ``root`` in the sandbox.

    ``ProbeError`` (one line) when it is refused, fails, or runs past ``limits.timeout_s``.
    """
    import duckdb

    if len(sql) > limits.max_sql_chars:
        raise ProbeError(f"SQL refused: {len(sql)} characters, over the sandbox's limit of "
                         f"{limits.max_sql_chars}")
    check_statement(sql)
    con, skipped = open_sandbox(root, limits)
    timer = threading.Timer(limits.timeout_s, con.interrupt)
    timer.daemon = True
    timer.start()
    try:
        rel = con.sql(sql)
        rows = rel.limit(limits.max_rows + 1).fetchall()
        columns = list(rel.columns)
    except duckdb.InterruptException:
        raise ProbeError(f"SQL stopped: it ran past the sandbox's limit of {limits.timeout_s:g} s") from None
    except duckdb.PermissionException as e:
        raise ProbeError(f"SQL refused: {str(e).splitlines()[0]}") from None
    except duckdb.Error as e:
        raise ProbeError(f"SQL error: {str(e).splitlines()[0]}") from None
    finally:
        timer.cancel()
        con.close()
    return QueryResult(columns, rows[:limits.max_rows], len(rows) > limits.max_rows, skipped)
