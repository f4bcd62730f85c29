"""``probe demo``: the main job, everything end to end on the bundled engine, then the dashboard.

1. starts a monitor service (127.0.0.1, a free port, its store under ``OUT/monitor``) that
   collects a deep trace automatically when it flags a straggler;
2. trains the bundled engine on ``--nproc`` ranks (2) with a planted slow rank, every rank
   streaming its step metrics (FLOPs and MFU included) to the monitor;
3. dumps the reference and the fused engine at module level, with a planted weight fault in the
   fused one, and compares the two dumps (no mapping file);
4. profiles 2 ranks for 3 steps into one merged Perfetto trace;
5. prints a summary (step table, alerts, first divergence, files) and serves the dashboard
   showing all of it (``--no-serve`` stops after the summary).

Exit codes: 0 done; 1 a stage failed (its one-line reason is printed); 2 bad input.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from probe.ground.errors import ProbeError
from probe.ground.text import printable
from probe.options import PORT, SEED, STEPS, check_port_free, force_option

DEFAULT_OUT = os.path.join("runs", "demo")
#: what the demo writes in --out, and replaces on the next run (nothing else there is touched)
DEMO_ENTRIES = ["monitor", "demo-train", "dump-reference", "dump-fused", "compare", "profile"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stage(text: str) -> None:
    click.secho(f"\n== {text}", bold=True)


def _cli(*args: str) -> None:
    """Run one ``probe`` verb in this process; a failure stops the demo with its message."""
    from probe.cli import main

    code = main(list(args))
    if code:
        raise ProbeError(f"'probe {' '.join(args)}' failed with exit code {code}", exit_code=1)


def _start_monitor(out: Path, port: int, trace_steps: int) -> subprocess.Popen:
    from probe.monitor.client import MonitorClient

    log = open(out / "monitor.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe.cli", "monitor", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--store", str(out / "monitor.duckdb"), "--trace-on-alert", f"straggler:{trace_steps}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = MonitorClient(f"127.0.0.1:{port}")
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise ProbeError(f"the monitor service exited at start; see {out / 'monitor.log'}", exit_code=1)
        try:
            client.status()
            return proc
        except ProbeError:
            time.sleep(0.3)
    proc.terminate()
    raise ProbeError(f"the monitor service did not answer in 60 s; see {out / 'monitor.log'}", exit_code=1)


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@click.command("demo")
@click.option("--preset", default="tiny", show_default=True, help="Model size preset of the bundled engine.")
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(min=1),
              help="Ranks of the monitored training run (at most 64).")
@click.option("--max-steps", "max_steps", default=40, show_default=True, type=STEPS,
              help="Steps of the monitored training run.")
@click.option("--slow-rank", default=1, show_default=True, type=click.IntRange(min=0),
              help="The rank planted slow.")
@click.option("--slow-factor", default=3.0, show_default=True, type=click.FloatRange(1.0, 1000.0),
              help="How much slower it computes.")
@click.option("--fault", default="scale:decoder.layers.1.mlp.linear_fc2.weight:3", show_default=True,
              metavar="KIND:TARGET:ARG", help="Fault planted in the fused engine's dump.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Random seed.")
@click.option("--out", default=DEFAULT_OUT, show_default=True,
              help="Output directory (an earlier demo's output in it is replaced; nothing else).")
@force_option
@click.option("--serve/--no-serve", default=True, help="Serve the dashboard at the end.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Dashboard address.")
@click.option("--port", default=8050, show_default=True, type=PORT, help="Dashboard port.")
def command(preset: str, nproc: int, max_steps: int, slow_rank: int, slow_factor: float, fault: str,
            seed: int, out: str, force: bool, serve: bool, host: str, port: int) -> int:
    """Train, monitor, dump, compare and profile the bundled engine, then serve the dashboard."""
    from probe.engine_adapter.callbacks import CallbackSpec
    from probe.engine.launch import run_training, validate
    from probe.engine.spec import RunSpec
    from probe.monitor.address import ADDR_ENV
    from probe.commands.train import print_step_table
    from probe.profiler.engine_callbacks import FlopsCallback

    root = Path(out)
    job = "demo-train"
    signal.signal(signal.SIGTERM, _interrupt)   # a SIGTERM stops the monitor service too
    train_spec = RunSpec(preset=preset, nproc=nproc, max_steps=max_steps, seed=seed,
                         faults=(f"slow:{slow_rank}:{slow_factor:g}",), out_dir=str(root / job),
                         callbacks=(CallbackSpec(FlopsCallback),))
    validate(train_spec)
    if serve:
        check_port_free(host, port)
    from probe.ground.outdir import claim

    claim(root, "demo", DEMO_ENTRIES, force=force)
    (root / "monitor").mkdir(parents=True)
    monitor_port = _free_port()
    addr = f"127.0.0.1:{monitor_port}"
    monitor = None
    try:
        _stage(f"1/5 monitor service on {addr}")
        monitor = _start_monitor(root / "monitor", monitor_port, trace_steps=3)
        click.echo(f"listening; a straggler alert triggers a 3-step deep trace (log {root / 'monitor' / 'monitor.log'})")

        _stage(f"2/5 training {preset} on {nproc} ranks, rank {slow_rank} planted {slow_factor:g}x slower")
        os.environ[ADDR_ENV] = addr
        try:
            result = run_training(train_spec)
        finally:
            os.environ.pop(ADDR_ENV, None)
        print_step_table(result)
        alerts = _monitor_findings(addr, job)

        _stage("3/5 dumps: reference engine, and fused engine with " + fault)
        click.echo("(--allow-nan: a NaN/Inf loss the planted fault may cause is expected, and dumped)")
        dump_ref, dump_fused = root / "dump-reference", root / "dump-fused"
        common = ["--level", "module", "--preset", preset, "--seed", str(seed), "--steps", "0",
                  "--quiet"]
        _cli("dump", *common, "--engine", "reference", "--out", str(dump_ref))
        _cli("dump", *common, "--engine", "fused", "--fault", fault, "--allow-nan",
             "--out", str(dump_fused))

        _stage("4/5 compare reference vs fused (no mapping file)")
        cmp_dir = root / "compare"
        a, b = dump_ref / "step0" / "rank0" / "dump.json", dump_fused / "step0" / "rank0" / "dump.json"
        _cli("compare", str(a), str(b), "--out", str(cmp_dir))

        _stage("5/5 profile 2 ranks, steps 1-3, one merged trace")
        prof = root / "profile"
        _cli("profile", "--preset", preset, "--nproc", "2", "--steps", "1-3", "--max-steps", "4",
             "--quiet", "--out", str(prof))

        _stage("summary")
        _summary(root, result, alerts, cmp_dir, prof)
        if not serve:
            return 0
        from probe.web.app import create_app, serve as serve_app

        app = create_app(dump_a=str(a), dump_b=str(b), compare_dir=str(cmp_dir), monitor_addr=addr,
                         store_dirs=(str(root / job), str(prof)), trace_file=str(prof / "trace.json"),
                         job=job)
        click.echo("\ndashboard (the URL carries the access token of its SQL page):")
        serve_app(app, host=host, port=port)
        return 0
    finally:
        _stop(monitor)


def _monitor_findings(addr: str, job: str, wait_s: float = 20.0) -> list[dict]:
    """The monitor's alerts for ``job`` (waits briefly for the straggler verdict and its trace)."""
    from probe.monitor.client import MonitorClient

    client = MonitorClient(addr)
    deadline = time.time() + wait_s
    alerts: list[dict] = []
    while time.time() < deadline:
        alerts = client.alerts(job=job).to_pylist()
        traces = client.traces(job=job).to_pylist()
        if any(a["kind"] == "straggler" for a in alerts) and traces:
            break
        time.sleep(0.5)
    return alerts


def _summary(root: Path, result, alerts: list[dict], cmp_dir: Path, prof: Path) -> None:
    import json

    from probe.engine.launch import STRAGGLER_QUERY, rank_table

    stragglers = sorted({a["rank"] for a in alerts if a["kind"] == "straggler"})
    from probe.ground.text import plural

    click.echo(f"training: {plural(len(result.steps), 'step')} on {plural(result.nproc, 'rank')}, "
               f"final loss {result.final_loss:.4f}")
    ranks = rank_table(result.out_dir)
    if ranks:
        click.echo(f"          slowest by own work: rank {ranks[0]['rank']} "
                   f"(compute {ranks[0]['compute_ms']:.1f} ms/step vs "
                   + ", ".join(f"rank {r['rank']} {r['compute_ms']:.1f}" for r in ranks[1:])
                   + "; own work leaves out the time a rank waits for the others in the gradient "
                     "all-reduce, which evens out the ranks' step times)")
    who = (f"rank {stragglers[0]}" if len(stragglers) == 1
           else f"ranks {', '.join(map(str, stragglers))}" if stragglers else "none")
    click.echo(f"monitor:  {plural(len(alerts), 'alert')}; straggler: {who}")
    for a in alerts[:5]:
        click.echo(f"          [{a['kind']}] step {a['step']}: {printable(a['message'])}")
    summary = json.loads((cmp_dir / "summary.json").read_text())
    first = summary.get("first_divergence")
    from probe.compare.verdict import format_counts

    click.echo(f"compare:  {summary.get('matched')} matched; " + format_counts(summary["counts"], sep="; "))
    click.echo("          first divergence: " + (f"{first['b']} ({first['direction']})" if first else "none"))
    click.echo(f"trace:    {prof / 'trace.json'} (open in https://ui.perfetto.dev)")
    click.echo(f"records:  probe query {root / 'demo-train'} \"{STRAGGLER_QUERY}\"")
