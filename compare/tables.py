"""Arrow tables lent to a DuckDB connection for the length of one stage of the compare.

A compare stage takes and returns pyarrow.Tables; to query them it registers them on the
connection it is given (zero-copy: DuckDB scans the Arrow buffers) under names of its own
choosing, and unregisters them when it is done, so no stage reads a name another left behind.

>>> import duckdb, pyarrow as pa
>>> con = duckdb.connect()
>>> with registered(con, t=pa.table({"x": [1, 2]})):
...     con.sql("select sum(x) from t").fetchall()
[(3,)]
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["registered"]


@contextmanager
def registered(con: Any, **tables: Any) -> Iterator[Any]:
    """``con`` with each of ``tables`` (name=pyarrow.Table) registered under its name, for
    the length of the ``with`` block."""
    for name, table in tables.items():
        con.register(name, table)
    try:
        yield con
    finally:
        for name in tables:
            con.unregister(name)
