"""``probe monitor dump``, ``dumps`` and ``export``: targeted dumps of chosen modules on chosen
ranks and steps with no restart (:mod:`probe.monitor.targeted_dump`), their list, and the stored
series as TensorBoard scalars (:mod:`probe.monitor.service.tensorboard_export`). Part of the ``probe
monitor`` group (:mod:`probe.commands.monitor`)."""

from __future__ import annotations

import json

import click

from probe.commands.monitor_options import addr_option, ca_option, token_option
from probe.ground.text import printable
from probe.options import SECONDS, STEPS, selection_option


@click.command("dump")
@addr_option
@token_option
@ca_option
@click.option("--job", required=True, help="The job (run name) to dump.")
@selection_option("--ranks", "ranks", "Ranks to dump, e.g. 0,3 (default: every rank of the job).")
@click.option("--steps", default=None, metavar="FIRST-LAST", help="Steps to dump, e.g. 120-124.")
@click.option("--next", "next_steps", default=None, type=STEPS, metavar="N",
              help="Dump the next N steps instead of a fixed range.")
@click.option("--scope", default=None, metavar="REGEX",
              help="Keep the entries whose name this regular expression matches (re.search "
                   "over names such as Module.layers.1.mlp.MLP.forward.0); default: all.")
@click.option("--module", default=None, metavar="PATH",
              help="Dump this module and every module inside it (layers.1.mlp): the scope "
                   "^Module\\.layers\\.1\\.mlp\\. made for you.")
@click.option("--task", type=click.Choice(["statistics", "tensor"]), default="statistics",
              show_default=True, help="Statistics per tensor, or whole tensors.")
@click.option("--level", type=click.Choice(["module", "mix"]), default="module",
              show_default=True, help="Modules only, or modules and the API calls inside them.")
@click.option("--wait/--no-wait", default=False, help="Wait until every rank has reported.")
@click.option("--timeout", default=300.0, show_default=True, type=SECONDS, help="Seconds to --wait.")
def dump(addr: str | None, token: str | None, ca: str | None, job: str, ranks: list[int] | None,
         steps: str | None, next_steps: int | None, scope: str | None, module: str | None,
         task: str, level: str, wait: bool, timeout: float) -> int:
    """Make ranks dump chosen modules for exactly the given steps, with no restart.

    Each rank writes msprobe's layout into its run folder,
    OUT/monitor_dumps/<id>/step{N}/rank{R}/dump.json, and reports it (probe monitor dumps).

    Example: probe monitor dump --job live --ranks 1 --next 2 --module layers.1
    """
    from probe.ground.errors import ProbeError
    from probe.monitor.client import MonitorClient
    from probe.monitor.targeted_dump import module_scope

    if scope and module:
        raise ProbeError("give either --scope or --module, not both")
    scope = module_scope(module) if module else (scope or "")
    with MonitorClient(addr, token=token, ca=ca) as client:
        reply = client.request_dump(job, ranks, steps=steps, next_steps=next_steps, scope=scope,
                                    task=task, level=level)
        what = f"steps {steps}" if steps else f"the next {next_steps} steps"
        click.echo(f"dump {reply['dump_id']}: {task} of {module or scope or 'every module'}, "
                   f"{what} of job {job} on ranks {','.join(map(str, reply['ranks'])) or '-'}"
                   + (f" (not connected now, queued: {','.join(map(str, reply['missing']))})"
                      if reply["missing"] else ""))
        if not wait:
            click.echo(f"see it later: probe monitor dumps --dump {reply['dump_id']}")
            return 0
        rows = client.wait_dump(reply["dump_id"], timeout).to_pylist()
    for row in rows:
        click.echo(f"  {_dump_line(row)}")
    return 1 if any(r["state"] != "done" for r in rows) else 0


def _dump_line(row: dict) -> str:
    """One rank's part of a targeted dump on one line (its names escaped: they come from the network)."""
    row = printable(row)
    head = f"{row['dump_id']} {row['job']} rank {row['rank']}"
    if row["state"] == "pending":
        return f"{head}: asked ({row['reason']}), not reported yet"
    if row["state"] == "failed":
        return f"{head}: no dump: {row['error']}"
    steps = json.loads(row["steps"] or "[]")
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    return (f"{head} {span} {row['task']} ({row['files']} files, {row['bytes']} bytes) "
            f"{row['path']}")


@click.command("dumps")
@addr_option
@token_option
@ca_option
@click.option("--job", default=None, help="Only this job.")
@click.option("--dump", "dump_id", default=None, help="Only this dump id.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
def dumps(addr: str | None, token: str | None, ca: str | None, job: str | None,
          dump_id: str | None, as_json: bool) -> int:
    """Targeted dumps asked for and where each rank wrote its part."""
    from probe.monitor.client import MonitorClient

    with MonitorClient(addr, token=token, ca=ca) as client:
        rows = client.dumps(job, dump_id).to_pylist()
    for row in rows:
        click.echo(json.dumps(row, default=str) if as_json else _dump_line(row))
    if not rows and not as_json:
        click.echo("no targeted dumps yet (probe monitor dump --job J --next N)")
    return 0


@click.command("export")
@addr_option
@token_option
@ca_option
@click.option("--tensorboard", "tensorboard", required=True, type=click.Path(file_okay=False),
              help="Write TensorBoard event files here: one run per job and rank (DIR/<job>/rank<R>/).")
@click.option("--job", default=None, help="Only this job (default: every job).")
@click.option("--store", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Read this monitor store (DuckDB file) instead of asking a running service; "
                   "not while a service has it open.")
def export(addr: str | None, token: str | None, ca: str | None, tensorboard: str,
           job: str | None, store: str | None) -> int:
    """Export the stored metric series (step metrics and per-module numerics) as TensorBoard
    scalars, one run per job and rank; view them with tensorboard --logdir DIR.

    Example: probe monitor export --tensorboard runs/tb --job live
    """
    from probe.monitor.service.tensorboard_export import export_points, points_from_service, points_from_store

    if store:
        table = points_from_store(store, job)
    else:
        from probe.monitor.client import MonitorClient

        with MonitorClient(addr, token=token, ca=ca) as client:
            table = points_from_service(client, job)
    summary = export_points(table, tensorboard)
    if not summary:
        click.echo(f"no metric points{f' for job {job}' if job else ''}: nothing written")
        return 0
    for (j, rank), info in sorted(summary.items()):
        click.echo(f"{j} rank {rank}: {info['points']} points, {info['tags']} tags -> {info['file']}")
    click.echo(f"view them: tensorboard --logdir {tensorboard}")
    return 0
