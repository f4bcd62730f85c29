"""``probe train``: the bundled engine alone."""

from __future__ import annotations

import click

from probe.options import engine_options, force_option, fsync_option


def spec_from_options(out: str, engine: str, preset: str, nproc: int, max_steps: int | None,
                      seed: int, faults: tuple[str, ...], device: str, default_steps: int = 10,
                      **kw):
    """A RunSpec from the shared engine options (used by train, dump, profile and demo)."""
    from engine.spec import RunSpec

    return RunSpec(engine=engine, preset=preset, nproc=nproc,
                   max_steps=max_steps if max_steps is not None else default_steps, seed=seed,
                   faults=tuple(faults), out_dir=out, device=device, **kw)


def print_step_table(result, echo=click.echo) -> None:
    """The human summary of a run: one line per step; "slowest" is the rank with the most own
    work (compute) in that step, which the synchronised step time cannot show."""
    echo(f"{'step':>5} {'loss':>10} {'step ms':>9} {'tokens/s':>10} {'slowest (compute ms)':>21}")
    for row in result.steps:
        slowest = f"rank {row['slowest_rank']} ({row['slowest_compute_ms']:.1f})"
        echo(f"{row['step']:>5} {row['loss']:>10.4f} {row['step_time_ms']:>9.1f} "
             f"{row['tokens_per_s']:>10.0f} {slowest:>21}")


@click.command("train")
@engine_options
@click.option("--compile/--no-compile", "compile_", default=None,
              help="torch.compile the fused engine's blocks (default: on CUDA only).")
@click.option("--weights", default=None, type=click.Path(), help="Reference-format safetensors weights.")
@click.option("--out", default="runs/train", show_default=True, help="Run directory.")
@force_option
@fsync_option
def command(engine, preset, nproc, max_steps, seed, faults, device, compile_, weights, out,
            force, fsync) -> int:
    """Train the bundled Llama-style engine on synthetic tokens and print a step table.

    Example: probe train --engine fused --preset tiny --nproc 2 --max-steps 5 --out runs/t
    """
    from engine.launch import run_training

    spec = spec_from_options(out, engine, preset, nproc, max_steps, seed, faults, device,
                             compile=compile_, weights=weights, force=force, fsync=fsync)
    result = run_training(spec)
    print_step_table(result)
    click.echo(f"trained {engine}/{preset} on {nproc} rank(s) for {len(result.steps)} steps; "
               f"final loss {result.final_loss:.4f}; records in {out}/store "
               f"(probe query {out} \"select * from steps\")")
    return 0
