"""``probe train``: the bundled engine alone."""

from __future__ import annotations


import click

from probe.ground.text import plural

from probe.ground.errors import EXIT_NONFINITE
from probe.options import (engine_options, flight_recorder_options, force_option, fsync_option,
                           numerics_option)


def spec_from_options(out: str, engine: str, preset: str, nproc: int, max_steps: int | None,
                      seed: int, faults: tuple[str, ...], device: str, default_steps: int = 10,
                      **kw):
    """A RunSpec from the shared engine options (used by train, dump, profile and demo)."""
    from probe.engine.spec import RunSpec

    return RunSpec(engine=engine, preset=preset, nproc=nproc,
                   max_steps=max_steps if max_steps is not None else default_steps, seed=seed,
                   faults=tuple(faults), out_dir=out, device=device, **kw)


def trained_text(engine: str, preset: str, nproc: int, result) -> str:
    """``trained reference/tiny on 2 ranks for 10 steps (0-9)``: what the run did."""
    steps = [row["step"] for row in result.steps]
    span = f" ({steps[0]}-{steps[-1]})" if len(steps) > 1 else ""
    return f"trained {engine}/{preset} on {plural(nproc, 'rank')} for {plural(len(steps), 'step')}{span}"


def print_step_table(result, echo=click.echo) -> None:
    """The human summary of a run: one line per step; "slowest" is the rank with the most own
    work (compute) in that step, which the synchronised step time cannot show."""
    echo(f"{'step':>5} {'loss':>10} {'step ms':>9} {'tokens/s':>10} {'slowest (compute ms)':>21}")
    for row in result.steps:
        slowest = f"rank {row['slowest_rank']} ({row['slowest_compute_ms']:.1f})"
        echo(f"{row['step']:>5} {row['loss']:>10.4f} {row['step_time_ms']:>9.1f} "
             f"{row['tokens_per_s']:>10.0f} {slowest:>21}")


@click.command("train", epilog=f"Exit codes: 0 done; 1 a rank failed; 2 bad input; "
               f"{EXIT_NONFINITE} the loss or gradient norm turned NaN/Inf (reported at its step, "
               f"training stopped there; --allow-nan trains on and exits 0).")
@engine_options
@click.option("--compile/--no-compile", "compile_", default=None,
              help="torch.compile the fused engine's blocks (default: on CUDA only).")
@click.option("--weights", default=None, type=click.Path(), help="Reference-format safetensors weights.")
@click.option("--out", default="runs/train", show_default=True, help="Run directory.")
@force_option
@fsync_option
@numerics_option
@flight_recorder_options
def command(engine, preset, nproc, max_steps, seed, faults, device, log_every, quiet, allow_nan,
            compile_, weights, out, force, fsync, numerics, flight_recorder=None,
            flight_recorder_stop=False) -> int:
    """Train the bundled Llama-style engine on synthetic tokens and print a step table.

    Progress goes to stderr while it trains (--quiet: none); the step table and the summary
    to stdout at the end.

    Examples:

        probe train --engine fused --preset tiny --nproc 2 --max-steps 5 --out runs/t

        probe train --nproc 2 --max-steps 4 --flight-recorder 4 --fault nan:layers.1.mlp@1:2 --allow-nan --out runs/fr
    """
    from probe.engine.launch import run_training
    from probe.engine_adapter.callbacks import CallbackSpec
    from probe.monitor.agent.numerics_callback import NumericsCallback

    from probe.commands.flight_options import claim_flight, flight_callbacks

    callbacks = (() if numerics is None else
                 (CallbackSpec(NumericsCallback, {"pattern": numerics or None}),))
    callbacks += flight_callbacks(flight_recorder, "module", flight_recorder_stop)
    claim_flight(out, "train", flight_recorder, force)
    spec = spec_from_options(out, engine, preset, nproc, max_steps, seed, faults, device,
                             compile=compile_, weights=weights, force=force, fsync=fsync,
                             quiet=quiet, log_every=log_every, allow_nan=allow_nan,
                             callbacks=callbacks)
    result = run_training(spec)
    print_step_table(result)
    final = f"{result.final_loss:.4f}" if result.final_loss is not None else "none"
    click.echo(f"{trained_text(engine, preset, nproc, result)}; final loss {final}; records in "
               f"{out}/store (probe query {out} \"select * from steps\")")
    result.check_finite(allow_nan)
    return 0
