"""``probe dump``: module-, API- and mix-level dumps of the bundled engine or of your script.

Without a SCRIPT it trains the bundled engine (``--engine reference`` by default) until the last
step selected by ``--steps`` and dumps those steps on every rank selected by ``--ranks``. With
``-- SCRIPT ARGS...`` it runs the script in-process (as ``python -m cProfile`` does) with hooks
on every model it runs; steps are counted by the optimizer.

Writes ``OUT/step{N}/rank{R}/dump.json, construct.json, stack.json`` (msprobe's format), the
record store under ``OUT/store`` (``probe query OUT "select * from tensors limit 5"``),
``OUT/dump_summary.json`` and the run's setup, ``OUT/config/rank{R}.json`` (``probe config-check``).

Exit codes: 0 done; 1 the script or a rank failed (the finished steps are still written);
2 bad input; 4 the bundled engine's loss or gradient norm turned NaN/Inf (training stops at that
step, which is dumped; ``--allow-nan`` trains on; ``--task overflow`` looks for NaN/Inf and so
allows it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import click

from probe.ground.errors import EXIT_NONFINITE, ProbeError
from probe.ground.frameworks import framework_names
from probe.ground.selection import format_selection
from probe.options import (engine_options, flight_recorder_options, force_option, fsync_option,
                           refuse_engine_options, selection_option)

DEFAULT_OUT = os.path.join("runs", "dump")


@click.command("dump", context_settings={"help_option_names": ["-h", "--help"]},
               epilog=f"Exit codes: 0 done; 1 the script or a rank failed (the finished steps are "
                      f"written); 2 bad input; {EXIT_NONFINITE} the bundled engine's loss or "
                      f"gradient norm turned NaN/Inf (training stops at that step, which is "
                      f"dumped; --allow-nan trains on; --task overflow allows it).")
@click.option("--level", type=click.Choice(["module", "api", "mix"]), default="module",
              show_default=True, help="module: every nn.Module (msprobe L0); api: torch/functional/"
                                      "Tensor/distributed calls (L1); mix: both.")
@click.option("--task", type=click.Choice(["statistics", "tensor", "md5", "check", "overflow"]),
              default="statistics", show_default=True,
              help="statistics: max/min/mean/norm/NaN/Inf; tensor: full tensors (msprobe's files; "
                   "--tensor-format); md5: a "
                   "content hash (CRC32); check: replay each API call on a high-precision golden and "
                   "grade it (no tensor written; --level api or mix); overflow: watch every output for "
                   "NaN/Inf and write only the first overflowing call(s).")
@click.option("--max-hits", "max_hits", default=1, show_default=True, type=click.IntRange(min=1),
              help="overflow: stop after this many overflowing calls.")
@click.option("--golden", type=click.Choice(["cpu-fp64", "cpu-fp32", "cuda-fp64"]), default="cpu-fp64",
              show_default=True, help="check: where and in what precision the golden runs.")
@click.option("--tensor-format", "tensor_format", type=click.Choice(["msprobe", "safetensors"]),
              default="msprobe", show_default=True,
              help="tensor: msprobe: the files msprobe's dump writes and its compare reads (.pt through "
                   "torch.save for PyTorch, .npy for MindSpore); safetensors: one .safetensors file "
                   "per tensor (no pickle).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="Bundled engine: bf16 runs the forward and loss under bfloat16 autocast.")
@selection_option("--steps", "--steps", "Steps to dump, e.g. 0,2-4 (default: every step run).")
@selection_option("--ranks", "--ranks", "Ranks to dump, e.g. 0,1 (default: all).")
@click.option("--scope", default=None, metavar="REGEX", help="Keep only entries whose name matches.")
@click.option("--list", "names", default=None, metavar="NAMES",
              help="Keep only these modules/APIs (comma-separated paths, classes or API names).")
@click.option("--framework", type=click.Choice(framework_names()), default="torch",
              show_default=True, help="Framework of the SCRIPT (the bundled engine is PyTorch).")
@click.option("--out", default=DEFAULT_OUT, show_default=True, help="Output directory.")
@click.option("--no-stack", is_flag=True, help="Do not record call stacks (stack.json stays empty).")
@force_option
@fsync_option
@engine_options
@flight_recorder_options
@click.argument("script", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT [ARGS...]]")
def command(level: str, task: str, max_hits: int, golden: str, tensor_format: str, dtype: str,
            steps: list[int] | None, ranks: list[int] | None,
            scope: str | None, names: str | None, framework: str, out: str, no_stack: bool,
            force: bool, fsync: str, engine: str, preset: str, nproc: int, max_steps: int | None, seed: int,
            faults: tuple[str, ...], device: str, log_every: int, quiet: bool, allow_nan: bool,
            script: tuple[str, ...], flight_recorder: int | None = None,
            flight_recorder_stop: bool = False) -> int:
    """Dump statistics, tensors or hashes of every module/API of a run.

    With --flight-recorder K nothing is written as the run goes: every rank keeps its last K
    steps (--level module or mix) in memory and writes them as this dump when a trigger fires.
    """
    refuse_engine_options(click.get_current_context(), script)
    if flight_recorder is not None:
        return _run_flight(flight_recorder, flight_recorder_stop, level, task, out, force, fsync,
                           framework, script, engine=engine, preset=preset, nproc=nproc,
                           max_steps=max_steps, seed=seed, faults=faults, device=device,
                           dtype=dtype, quiet=quiet, log_every=log_every, allow_nan=allow_nan)
    if scope:
        try:
            re.compile(scope)
        except re.error as e:
            raise ProbeError(f"--scope {scope!r}: not a regular expression ({e})") from None
    options: dict[str, Any] = {"level": level, "task": task, "steps": steps, "ranks": ranks,
                               "scope": scope, "names": names, "stack": not no_stack,
                               "max_hits": max_hits, "golden": golden, "tensor_format": tensor_format}
    _check_task(out, level, task, max_hits, golden)
    if script and dtype != "fp32":
        raise ProbeError("--dtype applies to the bundled engine; a SCRIPT sets its own precision")
    if script:
        from probe.launcher import given_options, relaunch, split_launcher

        launched = split_launcher(list(script))
        if launched is not None:          # torchrun ... train.py: a dump on every rank
            _claim(out, force)
            code = relaunch("dump", given_options("dump", script), *launched)
            _summarise(out, options, code)
            return code
        code = _run_script(list(script), framework, out, options, force, fsync)
    else:
        if framework != "torch":
            raise ProbeError(f"--framework {framework} needs a SCRIPT (probe dump --framework {framework} "
                             "-- train.py); the bundled engine is PyTorch")
        allow = allow_nan or task == "overflow"     # overflow looks for NaN/Inf: finding one is its job
        result = _run_engine(out, options, engine=engine, preset=preset, nproc=nproc,
                             max_steps=max_steps, seed=seed, faults=faults, device=device, force=force,
                             fsync=fsync, dtype=dtype, quiet=quiet, log_every=log_every,
                             allow_nan=allow)
        _summarise(out, options, 0)
        result.check_finite(allow)
        return 0
    _summarise(out, options, code)
    return code


def _run_flight(steps: int, stop: bool, level: str, task: str, out: str, force: bool, fsync: str,
                framework: str, script: tuple[str, ...], **engine: Any) -> int:
    """``probe dump --flight-recorder K``: the run with a ring on every rank in place of the dump."""
    from probe.commands.flight_options import flight_callbacks, script_recorder

    if task != "statistics" or level == "api":
        raise ProbeError("--flight-recorder keeps statistics of modules (--level module) or of "
                         "modules and API calls (--level mix); drop --task/--level api")
    _claim(out, force)
    if script:
        from probe.script import check_script, run_script

        check_script(list(script))
        with script_recorder(steps, out, level=level, stop=stop, framework=framework):
            return run_script(list(script), "a triggered flight recorder's ring is written")
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec

    allow_nan = engine.pop("allow_nan")
    max_steps = engine.pop("max_steps")
    spec = RunSpec(**engine, max_steps=max_steps or 10, out_dir=out,
                   callbacks=flight_callbacks(steps, level, stop), owner="dump", force=force,
                   fsync=fsync, allow_nan=allow_nan)
    result = run_training(spec)
    written = sorted(Path(out).glob("flight_recorder/rank*.json"))
    click.echo(f"probe dump: flight recorder of {steps} steps ({level}): "
               + (f"{len(written)} ring(s) written -> probe origin {out}" if written
                  else "no trigger fired; nothing written"))
    result.check_finite(allow_nan)
    return 0


def _check_task(out: str, level: str, task: str, max_hits: int, golden: str) -> None:
    """Bad task options are one line before anything runs (inside a rank they would only be
    reported, and the run would go on without the dump)."""
    from probe.dumper.config import DumpConfig

    DumpConfig(out=out, level=level, task=task, max_hits=max_hits, golden=golden)
    if task == "check":
        from probe.checker.replay import golden as golden_backend
        golden_backend(golden)


def _run_engine(out: str, options: dict[str, Any], *, engine: str, preset: str, nproc: int,
                max_steps: int | None, seed: int, faults: tuple[str, ...], device: str,
                force: bool, fsync: str, dtype: str = "fp32", quiet: bool = False,
                log_every: int = 10, allow_nan: bool = False):
    from probe.engine_adapter.callbacks import CallbackSpec
    from probe.engine.launch import run_training
    from probe.engine.spec import RunSpec

    steps = options["steps"]
    needed = max(steps) + 1 if steps else 1
    if max_steps is not None and max_steps < needed:
        raise ProbeError(f"--max-steps {max_steps} stops before step {needed - 1} selected by --steps; "
                         f"use --max-steps {needed} or more")
    from probe.dumper.callback import DumpCallback

    dump = CallbackSpec(DumpCallback, {**options, "out": out, "fsync": fsync})
    spec = RunSpec(engine=engine, preset=preset, nproc=nproc, max_steps=max(max_steps or 0, needed),
                   seed=seed, faults=tuple(faults), out_dir=out, device=device, callbacks=(dump,),
                   owner="dump", force=force, fsync=fsync, dtype=dtype, quiet=quiet,
                   log_every=log_every, allow_nan=allow_nan)
    _claim(out, force)
    result = run_training(spec)
    from probe.dumper.callback import take_disk_full

    full = take_disk_full()
    if full is not None:       # the disk filled: the steps before are whole; one line, exit 2
        raise full
    return result


def _run_script(argv: list[str], framework: str, out: str, options: dict[str, Any],
                force: bool, fsync: str) -> int:
    """Dump a script's run (:class:`probe.dumper.script.ScriptDump` says what a step is)."""
    from probe.dumper.script import ScriptDump
    from probe.launcher import parent_sums_up
    from probe.script import check_script, run_script

    check_script(argv)
    if not parent_sums_up():             # (a relaunched rank: its parent claimed the folder)
        _claim(out, force)
    with ScriptDump(out, framework=framework, fsync=fsync, **options):
        return run_script(argv, "finished steps are written")


def _claim(out: str, force: bool) -> None:
    """A dump directory holds one dump: an earlier dump's step folders and store are replaced;
    anything probe cannot prove the dump wrote stops it (``--force`` overrides)."""
    from probe.ground.outdir import claim

    claim(out, "dump", ["store", "step[0-9]*", "dump_summary.json", "check", "overflow_rank[0-9]*.json",
                        "config", "flight_recorder"],
          force=force)


def _summarise(out: str, options: dict[str, Any], code: int) -> None:
    if options["task"] == "check":
        from probe.dumper.check import summarise_run
        return summarise_run(out, options, code)
    if options["task"] == "overflow":
        from probe.dumper.overflow import summarise_run
        return summarise_run(out, options, code)
    from probe.launcher import parent_sums_up, rank_of_launch

    if parent_sums_up():                 # a rank under `probe dump -- torchrun ...`
        return
    only = rank_of_launch()              # a rank of `torchrun -m probe.cli dump`: its own part
    root = Path(out)
    found: dict[int, list[int]] = {}
    entries = 0
    for d in sorted(root.glob(f"step*/rank{'*' if only is None else only}/dump.json")):
        step = int(d.parent.parent.name[4:])
        found.setdefault(step, []).append(int(d.parent.name[4:]))
        try:
            entries += len(json.loads(d.read_text()).get("data", {}))
        except (OSError, ValueError):
            pass
    summary = {"out": str(root), "level": options["level"], "task": options["task"],
               "steps": sorted(found), "ranks": sorted({r for rs in found.values() for r in rs}),
               "entries": entries, "exit_code": code}
    if root.is_dir() and only is None:
        (root / "dump_summary.json").write_text(json.dumps(summary, indent=1))
    if not found or not entries:
        what = "no step was dumped" if not found else "every dumped step is empty (0 entries)"
        raise ProbeError(f"{out}: {what}: no module or API call of the run ran under the dump "
                         "(--steps or --ranks selecting none of the run's; a script whose model "
                         "is one leaf module: use --level mix or api; a launcher started inside "
                         "the script: give it as 'probe dump -- torchrun ... train.py')",
                         exit_code=1)
    from probe.ground.text import plural

    steps = (f"{plural(len(found), 'step')} ({format_selection(sorted(found))})" if len(found) > 1
             else f"step {next(iter(found))}")
    where = f"rank {only}" if only is not None else plural(len(summary['ranks']), 'rank')
    click.echo(f"probe dump: {options['level']}/{options['task']}: {steps} on "
               f"{where}, {plural(entries, 'entry', 'entries')} -> "
               f"{out}/step{{N}}/rank{{R}}/dump.json")
    click.echo(f"  query: probe query {out} \"select node, slot, max, min, mean, l2norm "
               "from tensors limit 10\"")

