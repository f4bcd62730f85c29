"""``probe web``: serve the dashboard (graph diff, live cluster, timeline, SQL).

The URL it prints carries the dashboard's token (``--token``, ``$PROBE_WEB_TOKEN``, else a fresh
random one): bound beyond loopback every request needs it, on loopback the SQL page does. Only
requests whose Host header names this server are answered (``--allow-host`` adds names).
"""

from __future__ import annotations

import click

from probe.ground.errors import ProbeError
from probe.options import check_port_free


@click.command("web")
@click.option("--dump", "dumps", multiple=True, metavar="A [B]",
              help="A dump (dump.json, rank or dump directory); give it twice (or --dump A --dump B) "
                   "for a diff.")
@click.argument("more_dumps", nargs=-1, type=click.Path())
@click.option("--compare", "compare_dir", type=click.Path(), help="A `probe compare --out` directory.")
@click.option("--check", "check_dirs", multiple=True, type=click.Path(), metavar="DIR",
              help="A `probe check-api --out` directory: the graph marks the calls it flagged. Give it "
                   "once per dump (A, then B); default: DUMP/check when there is one.")
@click.option("--monitor", "monitor_addr", metavar="HOST:PORT", help="The `probe monitor serve` address.")
@click.option("--monitor-token", envvar="PROBE_MONITOR_TOKEN",
              help="The monitor's token (or PROBE_MONITOR_TOKEN).")
@click.option("--job", help="The job the live page follows (default: the latest).")
@click.option("--store", "stores", multiple=True, type=click.Path(),
              help="A run directory whose record store the live, timeline and query pages read.")
@click.option("--trace", "trace_file", type=click.Path(), help="A merged Chrome/Perfetto trace JSON.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8050, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: a free port; the printed URL names it).")
@click.option("--token", envvar="PROBE_WEB_TOKEN",
              help="The dashboard's token (or PROBE_WEB_TOKEN; default: a fresh random one, in the "
                   "printed URL).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Another name this server may be reached by (a Host header it answers).")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="PEM certificate: serve HTTPS.")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="PEM private key of --tls-cert.")
def command(dumps: tuple[str, ...], more_dumps: tuple[str, ...], compare_dir: str | None,
            check_dirs: tuple[str, ...], monitor_addr: str | None, monitor_token: str | None, job: str | None,
            stores: tuple[str, ...],
            trace_file: str | None, host: str, port: int, token: str | None,
            allow_hosts: tuple[str, ...], tls_cert: str | None, tls_key: str | None) -> int:
    """Serve the dashboard at http://HOST:PORT/.

    Examples:

        probe web --dump runs/demo/dump-reference runs/demo/dump-fused --compare runs/demo/compare

        probe web --compare runs/demo/compare          (opens the dumps the result names)

        probe web --store runs/demo/demo-train --trace runs/demo/profile/trace.json

        probe web --monitor 127.0.0.1:50051 --store runs/live        (a live job; see probe monitor)
    """
    paths = list(dumps) + list(more_dumps)
    if more_dumps and not dumps:
        raise ProbeError(f"{more_dumps[0]}: give dumps with --dump A [B]")
    if len(paths) > 2:
        raise ProbeError(f"{paths[2]}: --dump takes one or two dumps")
    check_port_free(host, port)         # before the dumps are read: a busy port fails at once
    from probe.web.app import create_app, serve

    app = create_app(dump_a=paths[0] if paths else None, dump_b=paths[1] if len(paths) > 1 else None,
                     compare_dir=compare_dir, monitor_addr=monitor_addr, store_dirs=stores,
                     trace_file=trace_file, job=job, monitor_token=monitor_token, check_dirs=check_dirs)
    serve(app, host, port, token=token, allow_hosts=allow_hosts, tls_cert=tls_cert, tls_key=tls_key)
    return 0
