"""``probe query DIR "SQL"``: DuckDB SQL over a run's record store."""

from __future__ import annotations

import click

from probe.ground.errors import ProbeError
from probe.options import MAX_ROWS, SECONDS


@click.command("query")
@click.argument("run_dir", type=click.Path())
@click.argument("sql")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@click.option("--max-rows", default=200, show_default=True, type=click.IntRange(1, MAX_ROWS),
              help="Rows to print in table mode (with --safe: rows to fetch at all).")
@click.option("--safe", is_flag=True,
              help="The SQL is untrusted: run it in the read-only sandbox (one SELECT over the run's "
                   "views, no other file, network, extension or setting; --max-rows, --timeout).")
@click.option("--timeout", "timeout_s", default=30.0, show_default=True, type=SECONDS,
              help="With --safe: seconds before the query is interrupted.")
def command(run_dir: str, sql: str, as_csv: bool, max_rows: int, safe: bool, timeout_s: float) -> None:
    """Run SQL over the records of RUN_DIR.

    Views: tensors, nodes, events, metrics, steps. Unreadable store segments are skipped with a
    warning. Examples:

        probe query runs/demo "select rank, step, loss from steps order by step"

        probe query --safe runs/demo "$UNTRUSTED_SQL"
    """
    if safe:
        from probe.collectors.sql_sandbox import Limits, run_untrusted

        result = run_untrusted(run_dir, sql, Limits(max_rows=max_rows, timeout_s=timeout_s))
        cols, rows, more = result.columns, result.rows, result.truncated
    else:
        cols, rows = _run_trusted(run_dir, sql)
        more = len(rows) > max_rows
    if cols is None:
        return
    if as_csv:
        import csv
        import sys
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
        return
    click.echo(format_table(cols, rows[:max_rows]))
    if safe:
        click.echo(f"({len(rows)} rows{'; the rest cut at --max-rows' if more else ''})")
    else:
        click.echo(f"({len(rows)} rows{f' (showing {max_rows})' if more else ''})")


def _run_trusted(run_dir: str, sql: str) -> tuple[list[str] | None, list[tuple]]:
    """Columns and rows of ``sql`` with all of DuckDB at hand (None columns: no result set)."""
    import duckdb

    from probe.collectors.store import open_store

    con = open_store(run_dir)
    try:
        rel = con.sql(sql)
        if rel is None:
            return None, []
        return rel.columns, rel.fetchall()
    except duckdb.Error as e:
        raise ProbeError(f"SQL error: {str(e).splitlines()[0]}") from None
    finally:
        con.close()


def format_table(cols: list[str], rows: list[tuple]) -> str:
    """Plain fixed-width table text for a terminal."""
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.6g}"
        return "NULL" if v is None else str(v)
    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join([line, sep, *body])
