"""``probe profile``: mstx ranges, steps, communication and FLOPs of a run, as one trace.

Without a SCRIPT it trains the bundled engine with the profiler plug-in on every rank (clocks
aligned by a barrier exchange at start); with ``-- SCRIPT ARGS...`` it runs the script
in-process, steps detected from ``optimizer.step()``. It writes:

- ``OUT/trace.json``: one Chrome/Perfetto trace, one process track per rank (open it in
  https://ui.perfetto.dev); the per-rank fragments stay in ``OUT/trace/``;
- event records (and per-step ``flops``/``mfu``/``hfu`` metrics) in ``OUT/store``
  (``probe query OUT "select * from events"``);
- with ``--otel otlp``, OpenTelemetry spans streamed over OTLP while the run goes (to the
  collector the standard ``OTEL_EXPORTER_OTLP_*`` variables name; needs the ``otlp`` extra);
  with ``--otel console``, spans on stdout.

Recording loses no event by default (``--overflow block``: a thread that records faster than
the recorder drains waits for it; ``spool``: the excess goes to disk; ``drop``: it is dropped,
and the count is in the trace's metadata, the store and the summary). See docs/profile.md.

``OUT`` is claimed first (:mod:`probe.ground.outdir`): an earlier profile's ``store``, ``trace`` and
``trace.json`` are replaced; anything else there (a ``probe train`` store, a file of yours)
stops the command unless ``--force``. Under a launcher (torchrun: every rank runs this command)
each rank replaces only its own part, see :func:`_claim`.

Exit codes: 0 done; 1 the script or a rank failed (what was recorded is still written);
2 bad input; 4 the bundled engine's loss or gradient norm turned NaN/Inf (training stops at that
step; ``--allow-nan`` trains on).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import click

from probe.ground.background import OVERFLOW_POLICIES
from probe.ground.errors import EXIT_NONFINITE, ProbeError
from probe.options import (engine_options, flight_recorder_options, force_option, fsync_option,
                           refuse_engine_options, selection_option)

DEFAULT_OUT = os.path.join("runs", "profile")
#: What ``probe profile`` writes at the top of ``OUT`` (claimed with ground.outdir.claim).
ENTRIES = ("store", "trace", "trace.json")


def _schedule(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple | None:  # noqa: ARG001
    if value is None:
        return None
    try:
        parts = tuple(int(v) for v in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) not in (3, 4) or min(parts) < 0 or parts[2] < 1:
        raise ProbeError(f"--schedule {value!r}: give WAIT,WARMUP,ACTIVE[,REPEAT] as non-negative "
                         "integers with ACTIVE >= 1, e.g. 1,1,3,1")
    return parts if len(parts) == 4 else parts + (1,)


@click.command("profile", context_settings={"help_option_names": ["-h", "--help"]},
               epilog=f"Exit codes: 0 done; 1 the script or a rank failed (what was recorded is "
                      f"written); 2 bad input; {EXIT_NONFINITE} the bundled engine's loss or "
                      f"gradient norm turned NaN/Inf (training stops at that step; --allow-nan "
                      f"trains on).")
@selection_option("--steps", "--steps", "Steps to record, e.g. 0-3 (default: every step run).")
@selection_option("--ranks", "--ranks", "Ranks to record, e.g. 0,1 (default: all).")
@click.option("--schedule", default=None, callback=_schedule, metavar="W,WU,A[,R]",
              help="torch.profiler-style schedule (wait, warmup, active, repeat) instead of --steps.")
@click.option("--out", default=DEFAULT_OUT, show_default=True, help="Output directory.")
@click.option("--peak-tflops", type=click.FloatRange(0, 1e9, min_open=True), default=None,
              help="Peak TFLOP/s of one device for MFU/HFU (GPUs: known models are looked up; "
                   "CPUs: give it, or MFU is not reported).")
@click.option("--no-flops", is_flag=True, help="Do not count FLOPs (no MFU/HFU).")
@click.option("--torch-ops", is_flag=True, help="Add torch.profiler's op-level activity to the trace.")
@click.option("--otel", type=click.Choice(["otlp", "console"]), default=None,
              help="Also export OpenTelemetry spans, nested, while the run goes: otlp (to the "
                   "collector OTEL_EXPORTER_OTLP_ENDPOINT/_PROTOCOL/_HEADERS name; pip install "
                   "'probe-toolchain[otlp]'), console (print them).")
@click.option("--overflow", type=click.Choice(list(OVERFLOW_POLICIES)), default="block",
              show_default=True,
              help="What a thread does when it records mstx events faster than they are drained "
                   "and its buffer is full: block (wait for the drain, lose nothing), spool "
                   "(write the excess to disk, lose nothing), drop (lose and count them).")
@click.option("--max-buffer", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              metavar="N", help="mstx records a thread buffers between two drains (about 33 bytes each).")
@force_option
@fsync_option
@engine_options
@flight_recorder_options
@click.argument("script", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT [ARGS...]]")
def command(steps: list[int] | None, ranks: list[int] | None, schedule: tuple | None, out: str,
            peak_tflops: float | None, no_flops: bool, torch_ops: bool, otel: str | None,
            overflow: str, max_buffer: int, force: bool, fsync: str,
            engine: str, preset: str, nproc: int, max_steps: int | None, seed: int,
            faults: tuple[str, ...], device: str, log_every: int, quiet: bool, allow_nan: bool,
            script: tuple[str, ...], flight_recorder: int | None = None,
            flight_recorder_stop: bool = False) -> int:
    """Profile a run: user mstx ranges, steps, communication, FLOPs/MFU; one merged trace.

    Examples:

        probe profile --nproc 2 --steps 1-3 --out runs/prof

        probe profile --steps 2-4 --peak-tflops 0.5 -- examples/train.py --steps 5
    """
    refuse_engine_options(click.get_current_context(), script)
    if steps is not None and schedule is not None:
        raise ProbeError("give either --steps or --schedule, not both")
    if peak_tflops is not None and peak_tflops <= 0:
        raise ProbeError(f"--peak-tflops {peak_tflops}: give a positive number (TFLOP/s of one device)")
    if otel == "otlp":
        from probe.collectors import otlp

        otlp.require("traces")          # one line that says what to install, before any run
    if not script and _launched_rank() is not None:
        raise ProbeError("under a launcher (torchrun) give a SCRIPT: probe profile -- train.py; "
                         "the bundled engine launches its own ranks (probe profile --nproc N)")
    options = {"steps": steps, "schedule": schedule, "peak_tflops": peak_tflops,
               "flops": not no_flops, "torch_ops": torch_ops, "otel": otel,
               "overflow": overflow, "max_buffer": max_buffer}
    if script:
        from probe.launcher import given_options, relaunch, split_launcher

        launched = split_launcher(list(script))
        if launched is not None:          # torchrun ... train.py: a profile on every rank
            code = relaunch("profile", given_options("profile", script), *launched)
        else:
            code = _run_script(list(script), out, options, force=force, fsync=fsync,
                               flight=(flight_recorder, flight_recorder_stop))
    else:
        code, result = _run_engine(out, options, ranks=ranks, engine=engine, preset=preset,
                                   nproc=nproc, max_steps=max_steps, seed=seed, faults=faults,
                                   device=device, force=force, fsync=fsync, quiet=quiet,
                                   log_every=log_every, allow_nan=allow_nan,
                                   flight=(flight_recorder, flight_recorder_stop))
        _summarise(out, overflow)
        if result is not None:
            result.check_finite(allow_nan)
        return code
    _summarise(out, overflow)
    return code


def _run_engine(out: str, options: dict[str, Any], *, ranks: list[int] | None, engine: str,
                preset: str, nproc: int, max_steps: int | None, seed: int,
                faults: tuple[str, ...], device: str, force: bool, fsync: str, quiet: bool = False,
                log_every: int = 10, allow_nan: bool = False,
                flight: tuple[int | None, bool] = (None, False)) -> tuple[int, Any]:
    from probe.engine_adapter.callbacks import CallbackSpec
    from probe.profiler.engine_callbacks import ProfileCallback
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec

    steps, schedule = options["steps"], options["schedule"]
    needed = max(steps) + 1 if steps else (sum(schedule[:3]) * max(schedule[3], 1) if schedule else 1)
    if max_steps is not None and max_steps < needed:
        raise ProbeError(f"--max-steps {max_steps} stops before the last selected step {needed - 1}; "
                         f"use --max-steps {needed} or more")
    if ranks is not None and max(ranks) >= nproc:
        raise ProbeError(f"--ranks {ranks}: rank {max(ranks)} does not exist with --nproc {nproc}")
    kwargs = {k: v for k, v in options.items() if v is not None}
    kwargs["ranks"] = ranks
    profile = CallbackSpec(ProfileCallback, kwargs)
    from probe.commands.flight_options import claim_flight, flight_callbacks

    claim_flight(out, "profile", flight[0], force)
    spec = RunSpec(engine=engine, preset=preset, nproc=nproc,
                   max_steps=max(max_steps or 0, needed, 5 if max_steps is None else 0),
                   seed=seed, faults=tuple(faults), out_dir=out, device=device,
                   callbacks=(profile, *flight_callbacks(flight[0], "module", flight[1])), owner="profile", force=force, fsync=fsync, quiet=quiet, log_every=log_every,
                   allow_nan=allow_nan)
    _claim(out, force)
    try:
        result = run_training(spec)
    except ProbeError as e:
        if e.exit_code != 1:
            raise
        click.echo(f"probe: error: {e}; what was recorded is written", err=True)
        return 1, None
    from probe.commands.train import trained_text

    recorded = ""
    if steps:
        from probe.ground.selection import format_selection
        recorded = (f"; recording steps {format_selection(steps)}"
                    + (f" of ranks {format_selection(ranks)}" if ranks else ""))
    elif schedule:
        recorded = f"; recording by the schedule {','.join(map(str, schedule))}"
    click.echo(trained_text(engine, preset, nproc, result) + recorded)
    return 0, result


def _run_script(argv: list[str], out: str, options: dict[str, Any], *, force: bool,
                fsync: str, flight: tuple[int | None, bool] = (None, False)) -> int:
    from probe.collectors.store import StoreWriter
    from probe.engine_adapter.base import get_adapter
    from probe.engine_adapter.steps import StepSource
    from probe.script import check_script, run_script
    from probe.profiler.engine_callbacks import ProfileCallback

    path = check_script(argv)
    _claim(out, force)
    adapter = get_adapter("torch")     # imports torch: the session's built-in ranges attach to it
    store = StoreWriter(out, rank=adapter.rank(), run=Path(out).name, fsync=fsync)
    profile = ProfileCallback(steps=options["steps"], schedule=options["schedule"],
                              otel=options["otel"], torch_ops=options["torch_ops"],
                              flops=options["flops"], peak_tflops=options["peak_tflops"],
                              step_ranges=True, overflow=options["overflow"],
                              max_buffer=options["max_buffer"])
    source = StepSource(adapter, [profile], out, run=store.run, store=store, setup=True).start()
    from probe.commands.flight_options import claim_flight, script_recorder

    claim_flight(out, "profile", flight[0], force)
    try:
        with script_recorder(flight[0], out, stop=flight[1]):
            code = run_script(argv, "what was recorded is written")
    finally:
        source.stop()
        if options["flops"]:
            _write_step_metrics(store, source.steps)
        store.close()
    report = profile.report.summary() if profile.report is not None else "no session ran"
    click.echo(f"profiled {path.name}: {report}")
    return code


#: The per-step metrics ``probe profile -- SCRIPT`` writes to the store (with FLOPs counted).
SCRIPT_METRICS = ("step_time_ms", "flops", "hw_flops", "mfu", "hfu")


def _write_step_metrics(store: Any, steps: list[dict[str, float]]) -> None:
    """Write each step's :data:`SCRIPT_METRICS` as metric points of the store's rank."""
    import time

    now = time.time_ns()
    store.write_rows("metric", [
        {"time_ns": now, "job": store.run, "rank": store.rank, "step": int(s["step"]), "name": k,
         "value": float(s[k])} for s in steps for k in SCRIPT_METRICS if k in s])


def _launched_rank() -> tuple[int, int] | None:
    """(rank, world size) when a launcher (torchrun) started this process as one of several."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return (int(os.environ.get("RANK", "0") or 0), world) if world > 1 else None


def _claim(out: str, force: bool) -> None:
    """Make ``out`` ready: an earlier profile's :data:`ENTRIES` are replaced, anything else stops
    the command unless ``force`` (see :mod:`probe.ground.outdir`).

    Under a launcher every rank runs this command at about the same time, and a rank may
    already be writing while another claims, so no rank may replace a whole ``store`` or
    ``trace`` folder that profile wrote: each rank removes only its own part
    (``store/*/rank<R>``, ``trace/rank<R>.json``; rank 0 also ``trace.json``), as before. The
    ranks claim one at a time, under a lock on ``OUT/.probe-outputs.json.lock`` (held across
    nodes where the file system has POSIX locks, as NFS does), so the manifest is read and
    written by one rank at a time: an entry no manifest names yet is claimed by the first rank
    (nothing to remove), one that profile wrote is left whole, and one that another verb wrote
    stops every rank, or with ``force`` is replaced by the first rank, before any rank of this
    launch has written, since each writes only after its own claim.
    """
    from probe.ground.outdir import claim, owner

    launched = _launched_rank()
    if launched is None:
        claim(out, "profile", ENTRIES, force=force)
        return
    rank = launched[0]
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ProbeError(f"{out}: exists and is not a directory; choose another --out")
    root.mkdir(parents=True, exist_ok=True)
    with _claim_lock(root):
        # an entry of ours is left whole (other ranks write into it); anything else is claimed
        mine = [name for name in ENTRIES[:2] if owner(root, name) != "profile" or not (root / name).exists()]
        claim(out, "profile", mine + (["trace.json"] if rank == 0 else []), force=force)
        for folder in root.glob(f"store/*/rank{rank}"):
            shutil.rmtree(folder, ignore_errors=True)
        (root / "trace" / f"rank{rank}.json").unlink(missing_ok=True)


@contextlib.contextmanager
def _claim_lock(root: Path) -> Iterator[None]:
    """Exclusive POSIX lock on ``root/.probe-outputs.json.lock`` (the ranks of one launch)."""
    import fcntl

    from probe.ground.outdir import MANIFEST

    with open(root / f"{MANIFEST}.lock", "a") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(fh, fcntl.LOCK_UN)


def _fragments(out: str, wait_s: float) -> list[str]:
    """The rank fragments under ``out/trace``; under a launcher rank 0 waits for every rank's."""
    import time

    pattern = os.path.join(out, "trace", "rank*.json")
    launched = _launched_rank()
    if launched is None:
        return glob.glob(pattern)
    rank, world = launched
    if rank != 0:
        return []
    deadline = time.monotonic() + wait_s
    while len(glob.glob(pattern)) < world and time.monotonic() < deadline:
        time.sleep(0.1)
    found = glob.glob(pattern)
    if len(found) < world:
        have = {Path(f).stem for f in found}
        missing = [str(r) for r in range(world) if f"rank{r}" not in have]
        click.echo(f"probe profile: no trace fragment of rank{'s' if len(missing) > 1 else ''} "
                   f"{', '.join(missing)} after "
                   f"{wait_s:.0f} s; merging the {len(found)} there are", err=True)
    return found


def _summarise(out: str, overflow: str) -> None:
    """Merge the rank fragments into ``out/trace.json`` and print what was recorded (the trace
    line also says how many mstx records recording dropped, under ``--overflow drop``).

    Under a launcher every rank runs this command: the others only write their fragment, and
    rank 0 waits (up to ``PROBE_MERGE_WAIT_S``, 120 s) for all of them before merging.
    """
    from probe.collectors.perfetto import merge_traces
    from probe.collectors.store import open_store

    launched = _launched_rank()
    if launched is not None and launched[0] != 0:
        click.echo(f"probe profile: rank {launched[0]}'s trace fragment is in {out}/trace; "
                   "rank 0 merges the trace")
        return
    fragments = _fragments(out, float(os.environ.get("PROBE_MERGE_WAIT_S", "120")))
    if not fragments:
        click.echo(f"probe profile: no step was recorded in {out}", err=True)
        return
    merged = merge_traces(fragments, os.path.join(out, "trace.json"))
    try:
        con = open_store(out)
        rows = con.sql("""SELECT kind, count(*), round(sum(host_end_ns - host_start_ns) / 1e6, 2)
                          FROM events GROUP BY kind ORDER BY kind""").fetchall()
        flops = con.sql("""SELECT rank, avg(CASE WHEN name = 'flops' THEN value END),
                                  avg(CASE WHEN name = 'mfu' THEN value END),
                                  avg(CASE WHEN name = 'hfu' THEN value END)
                           FROM metrics GROUP BY rank ORDER BY rank""").fetchall()
        dropped = con.sql("""SELECT rank, sum(value)::BIGINT FROM metrics
                             WHERE name = 'mstx_dropped_records' AND value > 0
                             GROUP BY rank ORDER BY rank""").fetchall()
    except ProbeError:
        rows, flops, dropped = [], [], []
    lost = ""
    if dropped:
        per_rank = ", ".join(f"rank {r}: {n}" for r, n in dropped)
        lost = (f"; {sum(n for _, n in dropped)} mstx records dropped under --overflow {overflow} "
                f"({per_rank})")
    click.echo(f"trace: {merged['path']} ({merged['events']} events, ranks {', '.join(merged['ranks'])}"
               f"{lost}); open it in https://ui.perfetto.dev")
    for kind, n, ms in rows:
        click.echo(f"  {kind:6s} {n:6d} events  {ms:10.2f} ms")
    for rank, fl, mfu, hfu in flops:
        if fl is None:
            continue
        util = f", MFU {mfu:.2%}, HFU {hfu:.2%}" if mfu is not None else " (give --peak-tflops for MFU)"
        click.echo(f"  rank {rank}: {_flops_text(fl)} per step{util}")
    click.echo(f"  query: probe query {out} \"select rank, step, domain, name, "
               "(host_end_ns - host_start_ns) / 1e3 as us from events order by host_start_ns\"")


def _flops_text(flops: float) -> str:
    """``1.23 GFLOP`` style text.

    >>> _flops_text(2.5e6), _flops_text(3e12)
    ('2.50 MFLOP', '3.00 TFLOP')
    """
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.2f} {unit}"
    return f"{flops:.0f} FLOP"
