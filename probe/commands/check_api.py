"""``probe check-api DUMP_DIR``: replay every recorded API call on a trusted backend in higher
precision and grade it against a standard that knows the operation and the dtype.

Exit codes: 0 checked (or only verdicts below --fail-on); 1 a call is graded at or above
--fail-on; 2 bad input (one line); 3 internal error.
"""

from __future__ import annotations

import click

from probe.options import MAX_ROWS


@click.command("check-api", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dump_dir", type=click.Path())
@click.option("--golden", type=click.Choice(["cpu-fp64", "cpu-fp32", "cuda-fp64"]), default="cpu-fp64",
              show_default=True, help="Where and in what precision the golden runs.")
@click.option("--out", "out_dir", type=click.Path(), default=None,
              help="Folder for check_api.csv, check_api.parquet, summary.json [default: DUMP_DIR/check].")
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Exit 1 when any call is graded this bad or worse (nan is worse than error).")
@click.option("--top", default=20, show_default=True, type=click.IntRange(0, MAX_ROWS),
              help="Rows of the table printed.")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr [default: on a terminal].")
def command(dump_dir: str, golden: str, out_dir: str | None, fail_on: str | None, top: int,
            progress: bool | None) -> int:
    """Grade every API call of a tensor dump against a high-precision golden.

    DUMP_DIR: a dump made with ``probe dump --task tensor --level api`` (or mix; msprobe's
    L1/mix tensor dumps too): its folder, a step{N}/rank{R} folder or a dump.json.

    \b
    Example:
        probe dump --level api --task tensor --steps 0 --out runs/d
        probe check-api runs/d --out runs/check
    \b
    Random, in-place and communication calls and those without saved tensors are listed as
    skipped with the reason. Exit codes: 0 checked; 1 a call is graded at or above --fail-on;
    2 bad input; 3 internal error.
    """
    import os
    import sys
    from pathlib import Path

    from probe.checker.offline import check_dump
    from probe.checker.report import format_summary, format_table, write
    from probe.compare.verdict import at_least
    from probe.ground.outdir import claim

    if progress is None:
        progress = sys.stderr.isatty()
    out = Path(out_dir) if out_dir else Path(dump_dir if os.path.isdir(dump_dir) else os.path.dirname(dump_dir) or ".") / "check"
    rows, summary = check_dump(dump_dir, golden=golden, progress=progress)
    claim(out, "check-api", ["check_api.csv", "check_api.parquet", "summary.json"])
    write(rows, summary, out)
    click.echo(format_table(rows, top))
    click.echo(format_summary(summary))
    click.echo(f"wrote {out}/check_api.csv, check_api.parquet, summary.json")
    worst = [r["verdict"] for r in rows]
    return 1 if fail_on and any(at_least(v, fail_on) for v in worst) else 0
