"""Running ``probe`` in this test process: the same command line (:func:`probe.cli.main`, which
turns every error into one line and an exit code), without a new Python and a second import of
torch for every run (3-4 s each on a busy 2-core host). A few tests still run ``probe`` as a
separate process (:func:`tests.conftest.run_probe`) to prove the exit code a shell sees."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import torch


@dataclass
class Ran:
    """What one ``probe`` command did: as :class:`subprocess.CompletedProcess` names it."""

    returncode: int
    stdout: str
    stderr: str


def probe_here(*args: str) -> Ran:
    """Run ``probe ARGS`` in this process, capturing what it prints."""
    from probe.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    # a run in this process must leave the framework as it found it (no dump or fault wrapper
    # left in front of an API the next test replays)
    for fn in (torch.nn.functional.linear, torch.matmul, torch.Tensor.__mul__):
        assert not hasattr(fn, "__probe_original__") and not hasattr(fn, "__probe_fault_original__"), fn
    return Ran(code, out.getvalue(), err.getvalue())
