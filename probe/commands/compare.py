"""``probe compare A B``: match two dumps and find where numerics first diverge."""

from __future__ import annotations

import click

from probe.options import force_option

#: what ``probe compare`` writes at the top of ``--out`` (claimed with probe.ground.outdir.claim):
#: one pair's result files, or a run's summary.json and its step<N>/rank<R> (rank<R>, pair) folders
ENTRIES = ("compare.csv", "compare_msprobe.csv", "compare.parquet", "nodes.parquet", "summary.json",
           "compare.xlsx", "step[0-9]*", "rank[0-9]*", "pair")


@click.command("compare")
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--mapping", type=click.Path(), default=None,
              help="msprobe mapping file (layer_mapping.yaml, cell/API/data mapping YAML).")
@click.option("--out", "out_dir", type=click.Path(), default=None,
              help="Folder for compare.csv, compare_msprobe.csv (msprobe's column names and "
                   "order), compare.parquet, nodes.parquet, summary.json [default: ./compare_out].")
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Exit 1 when any tensor is graded this bad or worse (nan is worse than "
                   "error; for CI).")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr [default: on for inputs over 20 MB].")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Runs of several ranks: local processes comparing rank pairs at once "
                   "[default: one per core].")
@click.option("--cluster", default=None, metavar="ADDRESS",
              help="Runs of several ranks: compare the rank pairs on this Dask distributed "
                   "scheduler's workers (tcp://host:8786; they must see the same paths).")
@click.option("--xlsx", is_flag=True, default=False,
              help="Also write compare.xlsx (msprobe's columns, as compare_msprobe.csv; needs "
                   "openpyxl).")
@force_option
def command(a: str, b: str, mapping: str | None, out_dir: str | None, fail_on: str | None,
            progress: bool | None, workers: int | None, cluster: str | None, xlsx: bool,
            force: bool) -> int:
    """Compare dump A against dump B: match every module/API, grade every tensor, localise.

    A and B: a dump.json (construct.json and stack.json beside it), a step or rank folder, or a
    run folder with a store/ (msprobe-written or ours, PyTorch or MindSpore, any mix). Two run
    or step folders holding several step<N>/rank<R> dumps are compared pair by pair, on every
    core (or a cluster's workers), into OUT/step<N>/rank<R>/, with OUT/summary.json naming the
    rank whose numerics diverge first.

    OUT is claimed first (probe.ground.outdir): an earlier compare's files there are replaced,
    anything else of those names stops the command unless --force. Each file is written under
    a temporary name and moved into place whole once all are done.

    \b
    Example:
        probe compare ms/step0/rank0/dump.json torch/step0/rank0/dump.json --out cmp
        probe compare runs/ref runs/fused --out runs/cmp-ranks --workers 2
    \b
    Exit codes: 0 compared (or only verdicts below --fail-on); 1 a pair is graded at or
    above --fail-on; 2 bad input (one line naming the file); 3 internal error.
    """
    from pathlib import Path

    setup_process()
    from probe.compare.ranks import rank_pairs
    from probe.compare.verdict import at_least

    out = Path(out_dir) if out_dir else Path("compare_out")
    if xlsx:
        _need_openpyxl()
    from probe.ground.outdir import claim, discard_if_unused

    claim(out, "compare", ENTRIES, force=force)
    try:
        if rank_pairs(a, b)[0]:
            return _compare_runs(a, b, mapping, out, fail_on, workers, cluster, xlsx)
        from probe.compare.api import compare
        from probe.compare.report import format_summary

        if progress is None:
            progress = _size(Path(a)) + _size(Path(b)) > 20 * 1024 * 1024
        result = compare(a, b, mapping=mapping, progress=progress, out=out)
    except BaseException:
        discard_if_unused(out)          # a bad input leaves no empty folder behind
        raise
    if xlsx:
        _write_xlsx(result.rows, out / "compare.xlsx")
    click.echo(format_summary(result.summary))
    click.echo(f"wrote {out}/compare.csv, compare_msprobe.csv (msprobe's columns), compare.parquet, "
               f"nodes.parquet, summary.json" + (", compare.xlsx" if xlsx else ""))
    return 1 if fail_on and at_least(result.worst_verdict, fail_on) else 0


def _write_xlsx(rows: object, path: object) -> None:
    """compare.xlsx, whole or not at all (a temporary file moved into place)."""
    from probe.compare.msprobe_csv import write_xlsx
    from probe.compare.report import write_atomically

    write_atomically(path, lambda tmp: write_xlsx(rows, tmp))


def _need_openpyxl() -> None:
    """--xlsx without openpyxl: the one-line error before any work."""
    from probe.ground.errors import ProbeError

    try:
        import openpyxl  # noqa: F401
    except ImportError:
        raise ProbeError("--xlsx needs openpyxl, which is not installed: pip install openpyxl "
                         "(or pip install 'probe-toolchain[xlsx]')") from None


def _compare_runs(a: str, b: str, mapping: str | None, out: object, fail_on: str | None,
                  workers: int | None, cluster: str | None, xlsx: bool = False) -> int:
    """Two runs of several ranks, pair by pair (:func:`probe.compare.ranks.compare_runs`): a line per
    pair as it finishes, then the run summary."""
    from probe.compare.ranks import compare_runs, format_pair, format_runs
    from probe.compare.verdict import at_least
    from probe.ground.errors import ProbeError

    s = compare_runs(a, b, out, mapping=mapping, workers=workers, cluster=cluster,
                     report=lambda p: click.echo(format_pair(p)))
    click.echo(format_runs(s))
    click.echo(f"wrote {out}/summary.json and a compare per pair in {out}/step<N>/rank<R>/")
    if xlsx:
        from pathlib import Path

        import pyarrow.parquet as pq

        for p in s["ranks"]:
            if "error" not in p:
                _write_xlsx(pq.read_table(f"{p['out']}/compare.parquet"), Path(p["out"]) / "compare.xlsx")
    failed = [p for p in s["ranks"] if "error" in p]
    if failed:
        raise ProbeError(f"{len(failed)} of {s['pairs']} pairs could not be compared; the first, step "
                         f"{failed[0]['step']} rank {failed[0]['rank']}: {failed[0]['error']}")
    return 1 if fail_on and at_least(s["worst"], fail_on) else 0


def setup_process() -> None:
    """What ``probe compare`` sets up in its process before it imports anything heavy (the
    benchmark times the compare after the same setup): numpy's BLAS gets one thread (a compare
    multiplies no matrices, and OpenBLAS's idle threads spin on the cores the compare's DuckDB
    and Arrow threads need); Arrow allocates with jemalloc where pyarrow has it (else from the C
    library), not mimalloc, whose fresh pages are huge pages zeroed 2 MB at a time (a sixth of
    a compare's CPU time went to zeroing them: 20k entries 0.66 -> 0.63 s, 100k 2.68 -> 2.50 s,
    medians), and not the C library's, which kept freed buffers in each thread's arena (100k
    entries: peak 680-692 MB with it, 605-618 MB with jemalloc, CPU time alike). Arrow reads
    the setting when it first allocates, so this runs before pyarrow is imported; pyarrow's
    Linux wheels carry jemalloc (a build without it says so in one warning and uses its
    default). Settings the user made in the environment win; the processes it starts inherit
    them."""
    import os
    import sys

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc" if sys.platform.startswith("linux") else "system")


def _size(p: object) -> int:
    from pathlib import Path

    p = Path(str(p))
    try:
        if p.is_file():
            return p.stat().st_size
        return sum(f.stat().st_size for f in p.rglob("dump.json"))
    except OSError:
        return 0
