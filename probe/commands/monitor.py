"""``probe monitor``: the live monitor service and its operator commands.

    probe monitor serve [--host 127.0.0.1] [--port 50051] [--store FILE] [--token T]
                        [--trace-on-alert KIND:STEPS] [--stacks-on-hang] [--otlp]
                        [--dump-on-alert STEPS [--dump-on-alert-task statistics|tensor]]
    probe monitor status [--addr HOST:PORT] [--job J] [--json]
    probe monitor alerts [--job J] [--kind K] [--json]
    probe monitor trace --job J [--ranks 0,3] (--steps 120-124 | --next N) [--wait] [--out DIR]
    probe monitor trace --job J [--ranks 0,3] --stop
    probe monitor trace-files [--job J] [--trace ID]
    probe monitor interval --job J SECONDS
    probe monitor dump --job J [--ranks 0,3] (--steps 120-124 | --next N) [--scope REGEX]
                       [--module PATH] [--task statistics|tensor] [--level module|mix] [--wait]
    probe monitor dumps [--job J] [--dump ID] [--json]
    probe monitor export --tensorboard DIR [--job J] [--store FILE | --addr HOST:PORT]

The address of a running service comes from ``--addr`` or env ``PROBE_MONITOR``; the token
from ``--token`` or env ``PROBE_MONITOR_TOKEN``. Ranks of the bundled engine stream to the
service when ``PROBE_MONITOR=host:port`` is set in their environment. ``status`` shows a hung
job's diagnosis first (the rank that never entered the collective the others wait in) and the
collective each rank is in; an alert is one line per cause, updated in place (first and last
step, how many times it was seen).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import click

from probe.commands import monitor_dumps
from probe.commands.monitor_options import addr_option, ca_option, token_option
from probe.ground.text import printable
from probe.monitor.alert_kinds import ALERT_KINDS
from probe.options import PORT, SECONDS, STEPS, check_port_free, selection_option

@click.group("monitor")
def command() -> None:
    """Live cluster monitoring: serve, status, alerts, deep traces on demand."""


@command.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback needs --token.")
@click.option("--port", default=50051, show_default=True, type=PORT, help="Port (0 = any free one).")
@click.option("--store", default=None, type=click.Path(dir_okay=False),
              help="DuckDB store file [default: runs/monitor/monitor.duckdb].")
@click.option("--token", default=None, envvar="PROBE_MONITOR_TOKEN",
              help="Require this token on every call ($PROBE_MONITOR_TOKEN).")
@click.option("--tls-cert", default=None, type=click.Path(dir_okay=False), help="PEM certificate.")
@click.option("--tls-key", default=None, type=click.Path(dir_okay=False), help="PEM private key.")
@click.option("--trace-on-alert", multiple=True, metavar="KIND:STEPS",
              help="Deep-trace the rank an alert names for STEPS steps, e.g. straggler:3; KIND is "
                   f"one of {', '.join(k.name for k in ALERT_KINDS)}. Repeatable.")
@click.option("--stacks-on-hang", is_flag=True,
              help="On a hang alert, have every rank of the job dump its Python stacks into its "
                   "run folder (stacks/) and send them here (probe monitor trace-files).")
@click.option("--dump-on-alert", "dump_on_alert", default=0, type=click.IntRange(min=0),
              metavar="STEPS",
              help="On an alert that names a module ("
                   f"{', '.join(k.name for k in ALERT_KINDS if k.dumps)}), dump the module on the "
                   "rank it names for the next STEPS steps (a targeted dump, once per job, rank and module; probe "
                   "monitor dumps lists them).")
@click.option("--dump-on-alert-task", type=click.Choice(["statistics", "tensor"]),
              default="statistics", show_default=True,
              help="What --dump-on-alert records: statistics per tensor, or whole tensors.")
@click.option("--otlp", is_flag=True,
              help="Also export the metrics ranks push as OpenTelemetry metrics over OTLP, every "
                   "OTEL_METRIC_EXPORT_INTERVAL ms (5000), to the collector "
                   "OTEL_EXPORTER_OTLP_ENDPOINT/_PROTOCOL/_HEADERS name (pip install "
                   "'probe-toolchain[otlp]').")
def serve(host: str, port: int, store: str | None, token: str | None, tls_cert: str | None,
          tls_key: str | None, trace_on_alert: tuple[str, ...], stacks_on_hang: bool,
          dump_on_alert: int, dump_on_alert_task: str, otlp: bool) -> int:
    """Run the monitor service in the foreground until Ctrl-C or SIGTERM."""
    if otlp:
        from probe.collectors import otlp as otlp_export

        otlp_export.require("metrics")     # one line that says what to install, before binding
    check_port_free(host, port)       # before the store is opened: a busy port fails at once
    from probe.monitor.service.server import MonitorService, parse_trace_on_alert, serve_path_default

    svc = MonitorService(store_path=store or serve_path_default(), host=host, port=port,
                         token=token, tls_cert=tls_cert, tls_key=tls_key,
                         trace_on_alert=parse_trace_on_alert(trace_on_alert),
                         stacks_on_hang=stacks_on_hang, log=_log_line, otlp=otlp or None,
                         dump_on_alert=dump_on_alert, dump_on_alert_task=dump_on_alert_task)
    bound = svc.start()

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    click.echo(f"monitor listening on {host}:{bound} (store {svc.store.path}, "
               f"{'token required' if token else 'no token'}, {'TLS' if tls_cert else 'plaintext'})")
    click.echo(f"ranks stream to it with PROBE_MONITOR={host}:{bound}")
    if svc.otlp is not None:
        click.echo(f"metrics exported over OTLP to {svc.otlp.describe} every "
                   f"{svc.otlp.interval_ms / 1e3:g} s")
    sys.stdout.flush()
    try:
        svc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        svc.stop()
    click.echo(f"monitor stopped; {svc.points_ingested} points ingested this session")
    return 0


def _log_line(line: str) -> None:
    """One line of the foreground service's log, with the time."""
    import time

    click.echo(f"{time.strftime('%H:%M:%S')} {printable(line)}")
    sys.stdout.flush()


@command.command("status")
@addr_option
@token_option
@ca_option
@click.option("--job", default=None, help="Only this job.")
@click.option("--json", "as_json", is_flag=True, help="Print the status document as JSON.")
def status(addr: str | None, token: str | None, ca: str | None, job: str | None,
           as_json: bool) -> int:
    """Jobs, ranks, last step, health and alerts of a running service."""
    from probe.monitor.client import MonitorClient

    with MonitorClient(addr, token=token, ca=ca) as client:
        doc = client.status(job)
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
        return 0
    doc = printable(doc)                 # names from the network: no escape reaches the terminal
    svc = doc["service"]
    click.echo(f"monitor {svc['address']}  store {svc['store']}  up {svc['uptime_s']:.0f} s  "
               f"{svc['points_ingested']} points this session")
    if not doc["jobs"]:
        click.echo("no jobs yet: start training with PROBE_MONITOR set to this address")
    for j in doc["jobs"]:
        alerts = ", ".join(f"{k} {v}" for k, v in sorted(j["alerts"].items())) or "none"
        click.echo(f"\njob {j['job']}  world {j['world_size']}  last step {j['last_step']}  "
                   f"health {j['health']}  alerts: {alerts}")
        if j.get("hang"):
            click.secho(f"  HANG #{j['hang']['id']}: {j['hang']['message']}", bold=True)
        click.echo(f"  {'rank':>4}  {'health':<8}  {'step':>6}  {'seen':>7}  {'points':>9}  "
                   f"{'dropped':>7}  {'in collective':<22}  host:pid")
        for r in j["ranks"]:
            seen = "-" if r["last_seen_s"] is None else f"{r['last_seen_s']:.1f}s"
            c = r.get("collective")
            where = f"{c['op']} #{c['seq']} {c['waiting_s']:.1f}s" if c else "-"
            click.echo(f"  {r['rank']:>4}  {r['health']:<8}  {r['last_step']:>6}  {seen:>7}  "
                       f"{r['points']:>9}  {r['dropped']:>7}  {where:<22}  {r['host']}:{r['pid']}")
    if doc["alerts"]:
        click.echo("\nrecent alerts:")
        for a in doc["alerts"][-10:]:
            click.echo(f"  {_alert_line(a)}")
    return 0


def _alert_line(a: dict) -> str:
    """One alert on one line: id, kind, where, how often (an alert is updated in place)."""
    rank = "job" if a.get("rank") is None else f"rank {a['rank']}"
    steps = f"step {a['step']}"
    if (a.get("count") or 1) > 1:
        steps += f"-{a.get('last_step')} x{a['count']}"
    state = " (closed)" if a.get("state") == "closed" else ""
    return f"#{a['id']} {a['kind']:<13} {a['job']} {rank} {steps}{state}: {a['message']}"


@command.command("alerts")
@addr_option
@token_option
@ca_option
@click.option("--job", default=None, help="Only this job.")
@click.option("--kind", default=None,
              help="Only alerts of this kind: "
                   f"{'; '.join(f'{k.name} ({k.means})' for k in ALERT_KINDS)}.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.option("--follow", is_flag=True, help="Keep printing new alerts as they are raised.")
def alerts(addr: str | None, token: str | None, ca: str | None, job: str | None,
           kind: str | None, as_json: bool, follow: bool) -> int:
    """Alerts with their evidence (--follow to watch them live)."""
    from probe.monitor.client import MonitorClient

    def show(a: dict) -> None:
        ev = a["evidence"] if isinstance(a["evidence"], dict) else json.loads(a["evidence"] or "{}")
        if as_json:
            click.echo(json.dumps(dict(a, evidence=ev), default=str))
        else:
            click.echo(_alert_line(printable(a)))
        sys.stdout.flush()

    with MonitorClient(addr, token=token, ca=ca) as client:
        rows = client.alerts(job, kind=kind).to_pylist()
        for a in rows:
            show(a)
        if not follow:
            if not rows and not as_json:
                click.echo("no alerts")
            return 0
        last = rows[-1]["id"] if rows else 0
        try:
            for event in client.watch(job):
                if event.get("type") == "alert" and event["id"] > last and \
                        (kind is None or event["kind"] == kind):          # new ones, not updates
                    show(event)
        except KeyboardInterrupt:
            pass
    return 0


@command.command("trace")
@addr_option
@token_option
@ca_option
@click.option("--job", required=True, help="The job (run name) to trace.")
@selection_option("--ranks", "ranks", "Ranks to trace, e.g. 0,3 (default: every rank of the job).")
@click.option("--steps", default=None, metavar="FIRST-LAST", help="Steps to trace, e.g. 120-124.")
@click.option("--next", "next_steps", default=None, type=STEPS, metavar="N",
              help="Trace the next N steps instead of a fixed range.")
@click.option("--stop", is_flag=True, help="End the running deep traces of these ranks after the "
                                           "current step instead (they send what they recorded).")
@click.option("--wait/--no-wait", default=False, help="Wait until every rank has sent its trace.")
@click.option("--timeout", default=300.0, show_default=True, type=SECONDS, help="Seconds to --wait.")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="With --wait: copy the trace files here (OUT/rank<R>/).")
def trace(addr: str | None, token: str | None, ca: str | None, job: str, ranks: list[int] | None,
          steps: str | None, next_steps: int | None, stop: bool, wait: bool, timeout: float,
          out: str | None) -> int:
    """Make ranks run a full profiler session for exactly the given steps, then collect it.

    Example: probe monitor trace --job live --ranks 0,1 --next 3 --wait --out runs/live-trace
    """
    from probe.monitor.client import MonitorClient

    with MonitorClient(addr, token=token, ca=ca) as client:
        if stop:
            reply = client.stop_trace(job, ranks)
            click.echo(f"stop sent to ranks {','.join(map(str, reply['ranks'])) or '-'} of job {job}")
            return 0
        reply = client.request_trace(job, ranks, steps=steps, next_steps=next_steps)
        what = f"steps {steps}" if steps else f"the next {next_steps} steps"
        click.echo(f"trace {reply['trace_id']}: {what} of job {job} on ranks "
                   f"{','.join(map(str, reply['ranks'])) or '-'}"
                   + (f" (not connected now, queued: {','.join(map(str, reply['missing']))})"
                      if reply["missing"] else ""))
        if not wait and not out:
            click.echo(f"collect it later: probe monitor trace-files --trace {reply['trace_id']}")
            return 0
        table = client.wait_trace(reply["trace_id"], reply["ranks"] + reply["missing"], timeout)
        failed = 0
        for row in printable(table.to_pylist()):
            if row["error"]:
                failed += 1
                click.echo(f"  rank {row['rank']}: no trace: {row['error']}")
            else:
                click.echo(f"  rank {row['rank']}: steps {row['start_step']}-{row['end_step']} "
                           f"{row['filename']} ({row['bytes']} bytes) at {row['path']}")
        if out:
            for rank in sorted({r["rank"] for r in table.to_pylist() if not r["error"]}):
                paths = client.fetch_trace(reply["trace_id"], rank, os.path.join(out, f"rank{rank}"))
                click.echo(f"  copied rank {rank}: {len(paths)} files to {os.path.join(out, f'rank{rank}')}")
    return 1 if failed else 0


@command.command("trace-files")
@addr_option
@token_option
@ca_option
@click.option("--job", default=None, help="Only this job.")
@click.option("--trace", "trace_id", default=None, help="Only this trace id.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
def trace_files(addr: str | None, token: str | None, ca: str | None, job: str | None,
                trace_id: str | None, as_json: bool) -> int:
    """Trace files the ranks have sent back."""
    from probe.monitor.client import MonitorClient

    with MonitorClient(addr, token=token, ca=ca) as client:
        rows = client.traces(job, trace_id).to_pylist()
    for row in rows:
        if as_json:
            click.echo(json.dumps(row, default=str))
            continue
        row = printable(row)
        if row["error"]:
            click.echo(f"{row['trace_id']} {row['job']} rank {row['rank']}: no trace: {row['error']}")
        else:
            click.echo(f"{row['trace_id']} {row['job']} rank {row['rank']} steps "
                       f"{row['start_step']}-{row['end_step']} {row['filename']} "
                       f"({row['bytes']} bytes) {row['path']}")
    if not rows and not as_json:
        click.echo("no trace files yet (ranks send them after the last traced step)")
    return 0


@command.command("interval")
@addr_option
@token_option
@ca_option
@click.option("--job", required=True, help="The job (run name).")
@selection_option("--ranks", "ranks", "Ranks to change (default: every rank of the job).")
@click.argument("seconds", type=SECONDS)
def interval(addr: str | None, token: str | None, ca: str | None, job: str,
             ranks: list[int] | None, seconds: float) -> int:
    """Change how often the ranks' agents send their metric batches (SECONDS between them)."""
    from probe.monitor.client import MonitorClient

    with MonitorClient(addr, token=token, ca=ca) as client:
        reply = client.set_interval(job, seconds, ranks)
    click.echo(f"interval {seconds:g} s sent to ranks {','.join(map(str, reply['ranks'])) or '-'} "
               f"of job {job}")
    return 0


for _verb in (monitor_dumps.dump, monitor_dumps.dumps, monitor_dumps.export):
    command.add_command(_verb)
