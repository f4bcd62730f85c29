"""``probe origin RUN [--json]``: the first NaN, Inf or blow-up in a run's flight-recorder rings."""

from __future__ import annotations

import json

import click


@click.command("origin", epilog="Exit codes: 0 done (also when the rings hold nothing wrong); "
                                "2 RUN is not a run folder or holds no flight-recorder ring.")
@click.argument("run", type=click.Path())
@click.option("--json", "as_json", is_flag=True,
              help='Print {"step", "rank", "module", "direction", "tensor", "evidence"} as JSON.')
def command(run: str, as_json: bool) -> int:
    """Name where a NaN, an Inf or an outlier first appeared: (step, rank, module, direction,
    tensor), from every rank's ring written by --flight-recorder K, with no rerun.

    Example: probe origin runs/fr --json
    """
    from probe.compare.origin import find_origin

    found = find_origin(run)
    if as_json:
        click.echo(json.dumps(found))
        return 0
    if found["step"] is None:
        click.echo(f"probe origin: {found['evidence']}")
        return 0
    click.echo(f"origin: step {found['step']}, rank {found['rank']}, {found['module']} "
               f"{found['direction']}, {found['tensor']} ({found['cause']})")
    click.echo(f"  {found['evidence']}")
    return 0
