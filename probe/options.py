"""The click options shared by several verbs: step/rank selections and the bundled engine's options.

``--steps`` and ``--ranks`` always *select* (``0,2-4``, as msprobe's step and rank lists);
counts are ``--nproc`` and ``--max-steps``.

>>> from engine.config import PRESETS
from ground.selection import parse_selection
>>> parse_selection("0,2-4")
[0, 2, 3, 4]
"""

from __future__ import annotations

from typing import Callable

import click

from engine.config import PRESETS
from ground.selection import parse_selection


def selection_option(name: str, what: str, help_text: str) -> Callable:
    """A click option whose value is parsed by :func:`parse_selection`."""

    def convert(ctx, param, value):  # noqa: ARG001 - click callback signature
        return parse_selection(value, what=what)

    return click.option(name, default=None, callback=convert, metavar="LIST", help=help_text)


def engine_options(func: Callable) -> Callable:
    """Decorate a click command with the bundled engine's options (as ``probe train`` has)."""
    opts = [
        click.option("--engine", "engine", default="reference", show_default=True,
                     metavar="reference|fused", help="Implementation of the bundled engine."),
        click.option("--preset", default="tiny", show_default=True, metavar="NAME",
                     help=f"Model size preset ({', '.join(PRESETS)})."),
        click.option("--nproc", default=1, show_default=True, type=int,
                     help="Number of ranks (processes) to launch with torch.distributed."),
        click.option("--max-steps", "max_steps", default=None, type=int,
                     help="Number of training steps to run."),
        click.option("--seed", default=0, show_default=True, type=int, help="Random seed."),
        click.option("--fault", "faults", multiple=True, metavar="KIND:TARGET:ARG",
                     help="Plant a fault: scale:<param>:<factor>, nan:<module>:<step>, "
                          "slow:<rank>:<factor>. Repeatable."),
        click.option("--device", default="cpu", show_default=True,
                     help="Device for the bundled engine (cpu, cuda)."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def fsync_option(func: Callable) -> Callable:
    """``--fsync step|never``: force each finished step's records to disk (default step)."""
    return click.option("--fsync", type=click.Choice(["step", "never"]), default="step",
                        show_default=True,
                        help="step: each finished step's files (store segments, and a dump's "
                             "msprobe and tensor files) are forced to disk, so a power loss loses "
                             "at most the step in flight; never: left to the OS.")(func)


def force_option(func: Callable) -> Callable:
    """``--force``: replace entries of ``--out`` that probe cannot prove it wrote (see ground.outdir)."""
    return click.option("--force", is_flag=True,
                        help="Replace what is in --out even where probe cannot prove it wrote it "
                             "(by default only a verb's own earlier output is replaced).")(func)
