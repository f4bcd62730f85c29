"""The ``probe`` logger: how everything that runs inside a user's process speaks.

Every module logs through ``logging.getLogger(__name__)`` (a child of ``probe``), never
``print``: a host application routes, formats or silences the project's messages as it does any
library's (``logging.getLogger("probe").setLevel(logging.ERROR)``). With no configuration,
Python's last-resort handler still shows warnings and errors on stderr, as the messages read.
The command line (and the ranks it spawns) call :func:`print_to_stderr`, so a message reads
on the terminal exactly as it is written (``probe dump: ...``), info included; the records
still reach the root logger's handlers too (a host's, or pytest's ``caplog``).

>>> import io, logging
>>> stream = io.StringIO()
>>> handler = print_to_stderr(stream)
>>> logging.getLogger("probe.dumper.session").info("probe dump: 2 steps written")
>>> stream.getvalue()
'probe dump: 2 steps written\\n'
>>> print_to_stderr(stream) is handler      # once per process
True
>>> logging.getLogger(ROOT).removeHandler(handler)
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

#: The project's root logger; every module's logger is below it.
ROOT = "probe"


class _StderrHandler(logging.StreamHandler):
    """Writes each message as written; finds ``sys.stderr`` at each call when given no stream
    (a test or the CLI's runner may swap it)."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__(stream)
        self._fixed = stream is not None

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = sys.stderr
        super().emit(record)


def print_to_stderr(stream: TextIO | None = None) -> logging.Handler:
    """Make the ``probe`` logger print its messages (info and up) as plain lines on stderr
    (or ``stream``); idempotent. For the command line and the processes it starts."""
    logger = logging.getLogger(ROOT)
    for h in logger.handlers:
        if isinstance(h, _StderrHandler):
            return h
    handler = _StderrHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


@contextlib.contextmanager
def printing_to_stderr() -> Iterator[logging.Handler]:
    """:func:`print_to_stderr` for the length of a block (the command line's run in a process
    that goes on after it, such as a test's): the handler it added is removed afterwards.

    >>> with printing_to_stderr() as h:
    ...     h in logging.getLogger(ROOT).handlers
    True
    >>> h in logging.getLogger(ROOT).handlers
    False
    """
    logger = logging.getLogger(ROOT)
    before, level = list(logger.handlers), logger.level
    handler = print_to_stderr()
    try:
        yield handler
    finally:
        if handler not in before:
            logger.removeHandler(handler)
            logger.setLevel(level)
