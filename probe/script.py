"""Run a user's training script in this process, as ``python -m cProfile`` does.

``probe dump -- train.py ...`` and ``probe profile -- train.py ...`` attach their hooks first,
then call :func:`run_script`; the script sees its own ``sys.argv`` and its folder on
``sys.path``, both restored afterwards. Its exceptions become one line naming the script's
``file:line`` and exit code 1; with ``PROBE_DEBUG=1`` the script's full traceback is printed too.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "s.py"; _ = p.write_text("import sys; sys.exit(3)")
>>> run_script([str(p)], what_is_kept="nothing")
3
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import click

from probe.ground.errors import ProbeError


def check_script(argv: list[str]) -> Path:
    """The script path of ``argv``; a ProbeError when it is not a file."""
    path = Path(argv[0])
    if not path.is_file():
        raise ProbeError(f"{path}: no such script; give the Python file to run after '--'")
    return path


def run_script(argv: list[str], what_is_kept: str) -> int:
    """Run ``argv[0]`` with ``argv[1:]`` as its arguments; returns its exit code.

    ``what_is_kept`` finishes the one-line error printed when the script raises (for example
    "finished steps are written").
    """
    path = check_script(argv)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *argv[1:]]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - the user's error, reported as one line
        if os.environ.get("PROBE_DEBUG"):
            import traceback

            click.echo("".join(traceback.format_exception(type(e), e, _from_script(e.__traceback__))),
                       err=True, nl=False)
        click.echo(f"probe: error: {path} raised {type(e).__name__}: {_first_line(e)}"
                   f"{_where(e, path)}; {what_is_kept}"
                   + ("" if os.environ.get("PROBE_DEBUG") else " (PROBE_DEBUG=1 shows the traceback)"),
                   err=True)
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def _from_script(tb):
    """The traceback from the script's first frame on (runpy's frames above it are ours)."""
    start = tb
    while tb is not None:
        if "runpy" not in tb.tb_frame.f_code.co_filename and tb.tb_frame.f_code.co_filename != __file__:
            return tb
        tb = tb.tb_next
    return start


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def _where(e: BaseException, path: Path) -> str:
    """`` at script.py:LINE`` for the deepest frame of the script in the traceback."""
    where, tb = "", e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name == str(path) or name.endswith(path.name):
            where = f" at {path.name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where
