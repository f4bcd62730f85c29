"""The ``probe`` command line: one console script, one verb per module, loaded lazily.

Each verb lives in ``probe/commands/<verb>.py`` and is imported only when it runs, so
``probe compare`` and ``probe query`` never import torch.

Exit codes: 0 success; 1 a check failed (``compare --fail-on``, a failed run); 2 bad input or
usage (one line on stderr); 3 an internal error (one line; ``PROBE_DEBUG=1`` shows the
traceback); 4 the bundled engine's loss or gradient norm turned NaN/Inf (``--allow-nan`` trains
on; see ``ground.errors``); 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from probe.ground.errors import EXIT_USAGE, ProbeError
from probe.ground.files import disk_full, is_disk_full
from probe.ground.logs import printing_to_stderr

VERBS: dict[str, tuple[str, str]] = {
    "train": ("probe.commands.train", "Train the bundled engine (reference or fused)."),
    "dump": ("probe.commands.dump", "Dump module/API statistics, tensors or hashes of a run."),
    "compare": ("probe.commands.compare", "Compare two dumps and find where numerics diverge."),
    "profile": ("probe.commands.profile", "Profile a run: mstx ranges, steps, comms, FLOPs, trace."),
    "monitor": ("probe.commands.monitor", "Live monitor service: serve, status, trace."),
    "web": ("probe.commands.web", "Serve the dashboard: graph diff, live cluster, timeline, SQL."),
    "query": ("probe.commands.query", "Run DuckDB SQL over a run's record store."),
    "check-api": ("probe.commands.check_api", "Replay recorded API calls against a high-precision golden."),
    "demo": ("probe.commands.demo", "The main job: train, monitor, dump, compare, then the dashboard."),
    "simulate": ("probe.commands.simulate", "Memory and time of a training step at any scale, without the device."),
    "origin": ("probe.commands.origin", "The origin of a NaN, Inf or spike, from the flight recorder's rings."),
    "config-check": ("probe.commands.config_check", "What differs between two runs' setups, and what can explain divergence."),
    "repro": ("probe.commands.repro", "A standalone reproducer (torch + safetensors) of a divergence a compare found."),
}


class LazyGroup(click.Group):
    """A click group that imports a verb's module only when that verb is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in VERBS:
            return None
        module = importlib.import_module(VERBS[name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in VERBS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="probe-toolchain", prog_name="probe")
def cli() -> None:
    """Observability and precision debugging for deep-learning training."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line; turn every error into one line and an exit code. What the
    project's modules log reads on stderr as written while it runs."""
    with printing_to_stderr():
        return _run(argv)


def _run(argv: list[str] | None) -> int:
    try:
        args = sys.argv[1:] if argv is None else list(argv)
        rv = cli.main(args=args, prog_name="probe", standalone_mode=False, obj={"argv": args})
    except click.exceptions.Abort:
        click.echo("probe: interrupted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"probe: error: {e.format_message()}", err=True)
        return e.exit_code
    except ProbeError as e:
        click.echo(f"probe: error: {e}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        click.echo("probe: interrupted", err=True)
        return 130
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback
        if is_disk_full(e):   # a writer that did not say where: the file it was writing, if known
            click.echo(f"probe: error: {disk_full(getattr(e, 'filename', None) or 'the output folder', e)}", err=True)
            return EXIT_USAGE
        if os.environ.get("PROBE_DEBUG"):
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        click.echo(f"probe: internal error: {type(e).__name__}: {msg} "
                   "(set PROBE_DEBUG=1 for the traceback)", err=True)
        return 3
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
