"""``probe config-check A B``: what differs between two runs' setups, and which differences can
explain the runs diverging; ``probe config-check --record OUT [-- SCRIPT ARGS...]`` records one.

A and B are run folders (every ``probe train``/``probe dump`` run records ``OUT/config/rank{R}.json``),
their ``config`` folders or single record files. The comparison is :mod:`probe.compare.config_diff`;
the recording :mod:`probe.engine_adapter.run_config` (``record_config(model, optimizer, out)`` in a
script of your own).

Exit codes: 0 nothing that can explain divergence differs (run identity and shell noise may);
1 differences that can explain divergence; 2 bad input (one line); 3 internal error.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from probe.ground.errors import ProbeError
from probe.options import force_option


@click.command("config-check", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="A B | --record OUT [-- SCRIPT [ARGS...]]")
@click.option("--record", "record_out", default=None, metavar="OUT",
              help="Record instead of compare: run SCRIPT in this process and record its setup (the "
                   "first model to run forward, its optimizers, the first batches); with no SCRIPT, "
                   "this environment only (packages, variables, platform, determinism flags).")
@click.option("--out", "out_file", default=None, type=click.Path(dir_okay=False),
              help="Write the comparison as JSON to this file.")
@force_option
def command(args: tuple[str, ...], record_out: str | None, out_file: str | None, force: bool) -> int:
    """Compare two runs' setups: data and weights at step 0, seeds and determinism, framework
    and packages, hyperparameters, environment; rank what can explain divergence.

    \b
    Example:
        probe train --preset tiny --max-steps 2 --seed 0 --out runs/s0
        probe train --preset tiny --max-steps 2 --seed 1 --out runs/s1
        probe config-check runs/s0 runs/s1 --out check.json
        probe config-check --record runs/mine-setup -- examples/train.py --lr 3e-4
    \b
    Exit codes: 0 nothing that can explain divergence differs; 1 something does; 2 bad input;
    3 internal error.
    """
    if record_out is not None:
        if out_file is not None:
            raise ProbeError("--out names the comparison's JSON; with --record the record goes to "
                             "OUT/config/rank{R}.json")
        return _record(record_out, list(args), force)
    if len(args) != 2:
        raise ProbeError(f"give two runs to compare (got {len(args)}): probe config-check A B, "
                         "or record one with probe config-check --record OUT [-- SCRIPT]")
    from probe.compare.config_diff import check_configs, format_summary

    report = check_configs(args[0], args[1])
    for line in format_summary(report):
        click.echo(line)
    if out_file:
        try:
            Path(out_file).write_text(json.dumps(report.to_json(), indent=1, sort_keys=True,
                                                 default=str), encoding="utf-8")
        except OSError as e:
            raise ProbeError(f"--out {out_file}: cannot write it ({e.strerror})") from None
        click.echo(f"wrote {out_file}")
    return report.exit_code


def _record(out: str, script: list[str], force: bool) -> int:
    from probe.engine_adapter.config_format import CONFIG_DIRNAME
    from probe.ground.outdir import claim

    if script:
        from probe.script import check_script, run_script
        check_script(script)
    claim(out, "config-check", [CONFIG_DIRNAME], force=force)
    from probe.engine_adapter.config_format import config_path
    from probe.engine_adapter.run_config import ConfigRecorder, watch_config

    if not script:
        recorder = ConfigRecorder(out)
        recorder.close()
        click.echo(f"recorded this environment -> {config_path(out, recorder.rank)}")
        return 0
    recorder = watch_config(out)
    try:
        code = run_script(script, "the setup recorded so far is written")
    finally:
        if recorder is not None:
            recorder.close()
    if recorder is not None:
        click.echo(f"recorded the setup of {script[0]} -> {config_path(out, recorder.rank)}")
    return code
