"""``probe simulate``: will a training step fit in device memory, and how fast will it be.

Without a SCRIPT it simulates the bundled engine (any preset, any rank count, data, tensor and
pipeline parallel, ZeRO 0-3); with ``-- SCRIPT ARGS...`` it runs the script unchanged with every
tensor it makes fake (no storage), for ``--max-steps`` optimizer steps, as rank 0 of ``--nproc``
data-parallel ranks. Levels as MindSpore's ``MS_SIMULATION_LEVEL``: 0 operators and module
tree; 1 + memory from every op's inputs and outputs; 2 + workspaces and the allocator; 3 + time.
It writes ``OUT/simulation.json``, ``OUT/memory_timeline.html`` and the operator table in
``OUT/store`` (``probe query OUT "select * from events where domain = 'simulate'"``).

``--calibrate`` measures this machine (its CPU, and its GPU if any) for level 3 on
``--device cpu``; ``--validate`` runs the configuration for real here and prints predicted
against measured peak memory and step time.

Exit codes: 0 done; 1 the script raised or a validation missed its tolerance (what was
simulated is still written); 2 bad input.
"""

from __future__ import annotations

import click

from probe.ground.errors import ProbeError
from probe.options import MAX_BATCH, MAX_SEQ_LEN, SIM_RANKS, STEPS

DEFAULT_OUT = "runs/simulate"


@click.command("simulate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--preset", default="tiny", show_default=True, help="Bundled engine preset (tiny ... 7b).")
@click.option("--engine", default="reference", show_default=True, metavar="reference|fused",
              help="Implementation of the bundled engine.")
@click.option("--nproc", type=SIM_RANKS, default=None, help="Ranks in all (default: dp x tp x pp, or 1).")
@click.option("--dp", type=SIM_RANKS, default=None, help="Data-parallel ranks (default: nproc / (tp x pp)).")
@click.option("--tp", type=SIM_RANKS, default=1, show_default=True, help="Tensor-parallel ranks (bundled engine).")
@click.option("--pp", type=SIM_RANKS, default=1, show_default=True, help="Pipeline stages (bundled engine, 1F1B).")
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True,
              help="ZeRO stage 0-3 over the data-parallel group.")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Bundled engine's compute dtype (16-bit: autocast, fp32 weights and Adam state, as the engine's).")
@click.option("--level", type=click.IntRange(0, 3), default=3, show_default=True,
              help="0 ops and modules; 1 + memory; 2 + workspace and allocator; 3 + time.")
@click.option("--device", default="H100", show_default=True,
              help="Device for the full figures: H100, H200, A100, 910B, or cpu once calibrated.")
@click.option("--global-batch", type=click.IntRange(1, MAX_BATCH), default=None,
              help="Sequences per step over all ranks.")
@click.option("--micro-batch", type=click.IntRange(1, MAX_BATCH), default=None,
              help="Sequences per forward/backward of a rank.")
@click.option("--seq-len", type=click.IntRange(1, MAX_SEQ_LEN), default=None,
              help="Tokens per sequence (default: the preset's).")
@click.option("--max-steps", type=STEPS, default=2, show_default=True,
              help="Optimizer steps a script runs before the simulation stops it.")
@click.option("--out", default=DEFAULT_OUT, show_default=True, help="Output directory.")
@click.option("--force", is_flag=True, help="Replace what is in --out even if probe did not write it.")
@click.option("--calibrate", is_flag=True, help="Measure this machine for --device cpu and exit.")
@click.option("--validate", is_flag=True, help="Run the preset for real here; print predicted vs measured.")
@click.argument("script", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT [ARGS...]]")
def command(preset: str, engine: str, nproc: int | None, dp: int | None, tp: int, pp: int, zero: int,
            dtype: str, level: int, device: str, global_batch: int | None, micro_batch: int | None,
            seq_len: int | None, max_steps: int, out: str, force: bool, calibrate: bool,
            validate: bool, script: tuple[str, ...]) -> int:
    """Simulate a training step's memory and time at any scale, without the device.

    Examples:

        probe simulate --preset 7b --nproc 1024 --level 3

        probe simulate --preset 7b --nproc 64 --tp 4 --pp 2 --zero 1 --dtype bf16 --device H200

        probe simulate --nproc 8 --zero 2 -- examples/train.py
    """
    if calibrate:
        return _calibrate()
    if validate:
        return _validate(preset, engine, nproc, dp, tp, pp, script)
    if max_steps < 1:
        raise ProbeError(f"--max-steps {max_steps}: give at least 1 optimizer step")
    from probe.simulator.devices import get_device

    chosen = get_device(device)
    replay = level >= 3 and bool(chosen.curves)
    if script:
        traced, code, layout = _trace_script(list(script), nproc, dp, tp, pp, zero, max_steps, replay)
    else:
        traced, layout = _trace_engine(preset, engine, nproc, dp, tp, pp, zero, dtype, global_batch,
                                       micro_batch, seq_len, replay)
        code = 0
    from probe.simulator.outputs import write_outputs
    from probe.simulator.replay import replay_seconds
    from probe.simulator.report import summary
    from probe.simulator.simulation import simulate

    measured = None
    if replay:
        click.echo(f"timing each distinct op on this machine ({chosen.name}) ...", err=True)
        measured = {id(rt.trace): replay_seconds(rt.trace, chosen) for rt in traced.ranks}
    sim = simulate(traced, layout, level=level, device=chosen, measured=measured)
    paths = write_outputs(sim, out, force=force)
    click.echo(summary(sim.as_json()))
    files = ", ".join(f"{out}/{name}" for name in paths)
    click.echo(f"wrote {files} (probe query {out} \"select name, count(*) from events where "
               "domain = 'simulate' group by name\")")
    return code


def _trace_engine(preset: str, engine: str, nproc: int | None, dp: int | None, tp: int, pp: int,
                  zero: int, dtype: str, global_batch: int | None, micro_batch: int | None,
                  seq_len: int | None, replay: bool) -> tuple:
    from probe.engine.config import get_preset
    from probe.engine.models import ENGINES
    from probe.simulator.engine_workload import DTYPES, trace_engine
    from probe.simulator.layout import global_batch_for, make_layout

    if engine not in ENGINES:
        raise ProbeError(f"--engine {engine}: use one of {', '.join(ENGINES)}")
    cfg = get_preset(preset)
    note = None
    if global_batch is None:
        ranks = dp if dp is not None else max(1, (nproc or tp * pp) // (tp * pp))
        global_batch, note = global_batch_for(cfg.global_batch, ranks, micro_batch)
    layout = make_layout(nproc=nproc, dp=dp, tp=tp, pp=pp, zero=zero, global_batch=global_batch,
                         micro_batch=micro_batch)
    traced = trace_engine(preset, engine, DTYPES[dtype], layout, seq_len=seq_len, signatures=replay,
                          progress=lambda line: click.echo(line, err=True))
    if note:
        traced.notes.insert(0, note)
    return traced, layout


def _trace_script(argv: list[str], nproc: int | None, dp: int | None, tp: int, pp: int, zero: int,
                  max_steps: int, replay: bool) -> tuple:
    from probe.script import check_script, run_script
    from probe.simulator.layout import make_layout
    from probe.simulator.script_workload import trace_script

    if tp != 1 or pp != 1:
        raise ProbeError("--tp and --pp apply to the bundled engine; a script's ranks are data "
                         "parallel (--nproc or --dp, with --zero)")
    path = check_script(argv)
    ranks = dp or nproc or 1
    layout = make_layout(nproc=nproc, dp=dp, zero=zero, global_batch=ranks, micro_batch=1)
    click.echo(f"running {path} on fake tensors as rank 0 of {layout.nproc} ...", err=True)
    traced, code = trace_script(lambda: run_script(argv, "the simulation covers what ran"), str(path),
                                max_steps=max_steps, layout=layout, signatures=replay)
    return traced, code, layout


def _calibrate() -> int:
    import torch

    from probe.simulator.calibrate import calibrate
    from probe.simulator.devices import save_calibrated

    targets = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for target in targets:
        click.echo(f"measuring {target} ...", err=True)
        device = calibrate(target)
        path = save_calibrated(device)
        peaks = ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in device.peak_flops.items())
        overhead = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in device.curves["op_overhead_s"].items())
        click.echo(f"calibrated {device.name} ({device.source}): matmul {peaks}; memory "
                   f"{device.memory_bw / 1e9:.1f} GB/s; per-op overhead: {overhead}; saved to {path}")
    return 0


def _validate(preset: str, engine: str, nproc: int | None, dp: int | None, tp: int, pp: int,
              script: tuple[str, ...]) -> int:
    from probe.simulator.report import format_bytes, format_seconds
    from probe.simulator.validate import validate_cpu, validate_cuda

    if script or (nproc or 1) != 1 or (dp or 1) != 1 or tp != 1 or pp != 1:
        raise ProbeError("--validate runs the bundled engine on one rank here; drop the script and "
                         "--nproc/--dp/--tp/--pp")
    checks = validate_cpu(preset, engine) + validate_cuda(preset, engine)
    fmt = {"peak memory": format_bytes, "step time": format_seconds}
    click.echo(f"{'check':<12} {'device':<10} {'predicted':>12} {'measured':>12} {'error':>8}  "
               f"{'within':>6}  measured as")
    for c in checks:
        click.echo(f"{c.what:<12} {c.device:<10} {fmt[c.what](c.predicted):>12} "
                   f"{fmt[c.what](c.measured):>12} {c.error * 100:>+7.1f}%  "
                   f"{'yes' if c.ok else 'NO':>3} {c.tolerance * 100:.0f}%  {c.how}")
    if not any(c.device != "cpu" for c in checks):
        click.echo("cuda: no GPU on this machine; the CUDA checks were skipped")
    return 0 if all(c.ok for c in checks) else 1
