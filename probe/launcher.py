"""A launcher given as the SCRIPT: ``probe dump -- torchrun --nproc-per-node 2 train.py``.

Run in this process, ``torchrun`` would start its ranks as new processes that no hook reaches,
and the dump would end empty. So a launcher is recognised (``torchrun``, ``python -m
torch.distributed.run`` or ``torch.distributed.launch``), its own options are read with its own
parser, and the command is started again *under* it, one ``probe <verb>`` per rank::

    torchrun --nproc-per-node 2 -m probe.cli dump <the options given> -- train.py ARGS

Each rank writes its own ``rank{R}`` folders under the shared ``--out``; the ranks leave the
closing summary to this process, which says it once for all of them. A launcher form no rank
can be hooked in (``-m MODULE``, ``--no-python``) stops at once naming the form that works.

>>> split_launcher(["train.py", "--steps", "3"]) is None
True
>>> split_launcher(["torchrun", "--nproc-per-node", "2", "train.py", "--steps", "3"])
(['--nproc-per-node', '2'], ['train.py', '--steps', '3'])
"""

from __future__ import annotations

import os
import subprocess
import sys

from probe.ground.errors import ProbeError

#: Console scripts that launch ranks, and the modules ``python -m`` runs for the same.
LAUNCHER_SCRIPTS = ("torchrun",)
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
#: Set for the ranks of a relaunched command: the parent process sums up the run.
SUMMARY_ENV = "PROBE_RANKS_SUMMARY"


def _launcher_rest(argv: list[str]) -> list[str] | None:
    """The launcher's arguments after its name, or None when ``argv`` starts no launcher."""
    name = os.path.basename(argv[0]) if argv else ""
    if name in LAUNCHER_SCRIPTS:
        return argv[1:]
    if name.startswith("python") and len(argv) > 2 and argv[1] == "-m" and argv[2] in LAUNCHER_MODULES:
        return argv[3:]
    return None


def split_launcher(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """(the launcher's options, the script and its arguments) when ``argv`` runs a launcher;
    None for a plain script. A ProbeError when the launcher's arguments cannot be hooked."""
    rest = _launcher_rest(argv)
    if rest is None:
        return None
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    try:
        args = parser.parse_args(rest)
    except SystemExit:
        raise ProbeError(f"{argv[0]} {' '.join(rest)}: the launcher does not accept these arguments "
                         "(its --help lists them)") from None
    if args.module or args.no_python:
        form = "-m MODULE" if args.module else "--no-python"
        raise ProbeError(f"{argv[0]} {form}: probe hooks a Python script file; give it as "
                         f"'probe <verb> ... -- torchrun ... train.py', or run "
                         f"'torchrun ... -m probe.cli <verb> ... -- train.py'")
    n = len(args.training_script_args) + 1
    return rest[:len(rest) - n], rest[len(rest) - n:]


def relaunch(verb: str, probe_args: list[str], launcher_args: list[str],
             script_argv: list[str]) -> int:
    """Run ``probe <verb> <probe_args> -- <script_argv>`` on every rank under the launcher;
    its exit code (the highest of the ranks', as the launcher reports it)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher_args, "-m", "probe.cli",
           verb, *probe_args, "--", *script_argv]
    env = dict(os.environ, **{SUMMARY_ENV: "parent"})
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


def rank_of_launch() -> int | None:
    """This process's rank when a launcher started it among several ranks, else None."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return int(os.environ["RANK"]) if world > 1 else None
    except (KeyError, ValueError):
        return None


def parent_sums_up() -> bool:
    """Whether the process that relaunched this one says the run's summary (not this rank)."""
    return os.environ.get(SUMMARY_ENV) == "parent"


def given_options(verb: str, script: tuple[str, ...] | list[str]) -> list[str]:
    """The options this ``probe <verb>`` was given on its command line, without the SCRIPT part
    (what a rank started under the launcher is given again).

    >>> import click
    >>> with click.Context(click.Command("dump"), obj={"argv": ["dump", "--out", "o", "--",
    ...                                                         "torchrun", "t.py"]}):
    ...     given_options("dump", ("torchrun", "t.py"))
    ['--out', 'o']
    """
    import click

    argv = (click.get_current_context().find_root().obj or {}).get("argv", [])
    start = argv.index(verb) + 1 if verb in argv else 0
    options = argv[start:len(argv) - len(script)]
    return options[:-1] if options[-1:] == ["--"] else options
