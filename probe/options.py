"""Options shared by several verbs: step/rank selections and the bundled engine's options.

``--steps`` and ``--ranks`` always *select* (``0,2-4``, as msprobe's step and rank lists);
counts are ``--nproc`` and ``--max-steps``.

>>> parse_selection("0,2-4")
[0, 2, 3, 4]
"""

from __future__ import annotations

from typing import Callable

import click

from probe.errors import ProbeError


def parse_selection(text: str | None, *, what: str = "selection") -> list[int] | None:
    """Parse ``"0,2-4"`` into a sorted list of distinct non-negative ints (``None`` stays ``None``).

    >>> parse_selection("3, 1-2")
    [1, 2, 3]
    """
    if text is None:
        return None
    text = str(text).strip()
    if text == "":
        return None
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ProbeError(
                f"bad {what} {text!r}: use non-negative integers and ranges such as '0,2-4'"
            ) from None
    if any(v < 0 for v in out):
        raise ProbeError(f"bad {what} {text!r}: values must be >= 0, as in '0,2-4'")
    return sorted(out)


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
                     help="Model size preset (tiny, small, medium, large, 1b, 7b)."),
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
