"""The click options shared by several verbs: step/rank selections and the bundled engine's options.

``--steps`` and ``--ranks`` always *select* (``0,2-4``, as msprobe's step and rank lists);
counts are ``--nproc`` and ``--max-steps``.

>>> from probe.ground.selection import parse_selection
>>> parse_selection("0,2-4")
[0, 2, 3, 4]
"""

from __future__ import annotations

from typing import Callable

import click

from probe.engine.config import PRESETS
from probe.ground.errors import EXIT_NONFINITE, ProbeError
from probe.ground.selection import parse_selection

#: The stated maxima of numeric options (docs/SECURITY.md lists them): a value past one is a
#: one-line usage error (exit 2) before anything runs.
MAX_STEPS = 1_000_000_000            # --max-steps, --next
MAX_SEED = 2**32 - 1                 # --seed (numpy's seeds are 32-bit)
MAX_SIM_RANKS = 1 << 16              # probe simulate --nproc, --dp, --tp, --pp
MAX_SEQ_LEN = 1 << 15                # probe simulate --seq-len (tokens; time grows with its square)
MAX_BATCH = 1 << 20                  # probe simulate --global-batch, --micro-batch (sequences)
MAX_ROWS = 100_000_000               # --max-rows, --top
MAX_WAIT_S = 7 * 24 * 3600.0         # --timeout, interval seconds
PORT = click.IntRange(0, 65535)
STEPS = click.IntRange(1, MAX_STEPS)
SEED = click.IntRange(0, MAX_SEED)
SIM_RANKS = click.IntRange(1, MAX_SIM_RANKS)
SECONDS = click.FloatRange(0, MAX_WAIT_S, min_open=True)

#: the options of :func:`engine_options` (click parameter names), none of which apply to a SCRIPT
ENGINE_PARAMS = ("engine", "preset", "nproc", "max_steps", "seed", "faults", "device", "log_every",
                 "quiet", "allow_nan")


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
        click.option("--nproc", default=1, show_default=True, type=click.IntRange(min=1),
                     help="Number of ranks (processes) to launch with torch.distributed (at most 64)."),
        click.option("--max-steps", "max_steps", default=None, type=STEPS,
                     help="Number of training steps to run."),
        click.option("--seed", default=0, show_default=True, type=SEED, help="Random seed."),
        click.option("--fault", "faults", multiple=True, metavar="KIND:TARGET[@RANK]:ARG",
                     help="Plant a fault: scale:<param>:<factor>, grow:<param>:<rate> (the "
                          "weight times 1+rate every step), nan:<module>:<step>, "
                          "nangrad:<module>:<step> (NaN in its backward only), "
                          "overflow:<module>:<step> (its output times 1e10, 1e20, ... from that "
                          "step: Inf), spike:<module>:<step> (its output times 1e3 at that step), "
                          "slow:<rank>:<factor>; a module or parameter target@RANK plants it on "
                          "that rank only (nan:layers.1.mlp@2:6). Repeatable."),
        click.option("--device", default="cpu", show_default=True,
                     help="Device for the bundled engine (cpu, cuda)."),
        click.option("--log-every", "log_every", default=10, show_default=True,
                     type=click.IntRange(min=1), metavar="N",
                     help="Progress on stderr: a line every N steps (and at least every 10 s, and "
                          "the last step) when stderr is not a terminal; a bar when it is."),
        click.option("--quiet", "-q", is_flag=True, help="No progress while training (the "
                     "summary and errors are still printed)."),
        click.option("--allow-nan", "allow_nan", is_flag=True,
                     help=f"Train on when the loss or gradient norm turns NaN/Inf (reported at "
                          f"its step either way); without it training stops at that step and the "
                          f"command exits {EXIT_NONFINITE}."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def numerics_option(func: Callable) -> Callable:
    """``--numerics [REGEX]``: per-module numerics every step (probe.monitor.agent.numerics_callback)."""
    return click.option(
        "--numerics", "numerics", default=None, is_flag=False, flag_value="", metavar="[REGEX]",
        help="Measure per-module numerics every step (activation, weight, gradient and "
             "optimizer-state norms, update ratio, NaN/Inf counts) of every leaf module with "
             "parameters, or of the modules whose path matches REGEX; sent to the monitor "
             "(PROBE_MONITOR=host:port) as numerics:<module>:<quantity> points, else kept in "
             "the run's store.")(func)


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


def refuse_engine_options(ctx: click.Context, script: tuple[str, ...] | list[str]) -> None:
    """A ProbeError when a bundled-engine option is given together with a SCRIPT (the script
    sets its own model, steps and ranks; such an option would silently do nothing)."""
    if not script:
        return
    given = []
    for param in ctx.command.params:
        if param.name in ENGINE_PARAMS:
            source = ctx.get_parameter_source(param.name)
            if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
                given.append(param.opts[0])
    if given:
        verb = ctx.info_name or "probe"
        raise ProbeError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to the "
                         f"bundled engine, not to a SCRIPT (the script sets its own model, steps "
                         f"and ranks); drop {'it' if len(given) == 1 else 'them'} or drop the "
                         f"script: probe {verb} ... -- SCRIPT")


def check_port_free(host: str, port: int) -> None:
    """A ProbeError (exit code 2) when ``host:port`` cannot be listened on, before any work.

    Port 0 (the system picks a free port) is always free.

    >>> import socket
    >>> with socket.socket() as s:
    ...     s.bind(("127.0.0.1", 0)); s.listen()
    ...     try:
    ...         check_port_free("127.0.0.1", s.getsockname()[1])
    ...     except ProbeError as e:
    ...         print(str(e).split(";")[0].split(" is ")[1])
    in use
    """
    import errno
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the servers bind it
        try:
            s.bind((host, port))
        except OSError as e:
            why = "in use" if e.errno == errno.EADDRINUSE else f"not available ({e.strerror})"
            raise ProbeError(f"port {port} on {host} is {why}; pass --port 0 (a free port) or "
                             f"another --port") from None


#: the most steps a flight recorder keeps
MAX_FLIGHT_STEPS = 100_000


def flight_recorder_options(func: Callable) -> Callable:
    """``--flight-recorder K`` and ``--flight-recorder-stop`` (probe.dumper.flight)."""
    func = click.option("--flight-recorder-stop", "flight_recorder_stop", is_flag=True,
                        help="Stop training after the step whose trigger wrote the flight "
                             "recorder's ring (default: train on).")(func)
    return click.option("--flight-recorder", "flight_recorder", default=None,
                        type=click.IntRange(1, MAX_FLIGHT_STEPS), metavar="K",
                        help="Keep every rank's per-module statistics of the last K steps in "
                             "memory and write them as a dump (OUT/step{N}/rank{R}/, the store, "
                             "OUT/flight_recorder/rank{R}.json) when the loss or gradient norm "
                             "turns NaN/Inf or spikes, a step raises, or the rank gets SIGUSR1; "
                             "probe origin OUT names where it began.")(func)
