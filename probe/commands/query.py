"""``probe query DIR "SQL"``: DuckDB SQL over a run's record store."""

from __future__ import annotations

import click

from ground.errors import ProbeError


@click.command("query")
@click.argument("run_dir", type=click.Path())
@click.argument("sql")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@click.option("--max-rows", default=200, show_default=True, help="Rows to print in table mode.")
def command(run_dir: str, sql: str, as_csv: bool, max_rows: int) -> None:
    """Run SQL over the records of RUN_DIR.

    Views: tensors, nodes, events, metrics, steps. Example:

        probe query runs/demo "select rank, step, loss from steps order by step"
    """
    import duckdb

    from collectors.store import open_store

    con = open_store(run_dir)
    try:
        rel = con.sql(sql)
    except duckdb.Error as e:
        raise ProbeError(f"SQL error: {str(e).splitlines()[0]}") from None
    if rel is None:
        return
    try:
        cols = rel.columns
        rows = rel.fetchall()
    except duckdb.Error as e:
        raise ProbeError(f"SQL error: {str(e).splitlines()[0]}") from None
    if as_csv:
        import csv
        import sys
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
        return
    click.echo(format_table(cols, rows[:max_rows]))
    more = f" (showing {max_rows})" if len(rows) > max_rows else ""
    click.echo(f"({len(rows)} rows{more})")


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
