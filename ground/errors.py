"""The one error type users see.

Every package raises :class:`ProbeError` (or a subclass) for bad input: a corrupt file, an
unknown preset, a malformed selection. The command line prints it as a single line, never a
traceback, and exits with its ``exit_code``.

>>> try:
...     raise ProbeError("runs/x/dump.json: truncated JSON at byte 120")
... except ProbeError as e:
...     print(e)
runs/x/dump.json: truncated JSON at byte 120
"""

from __future__ import annotations


class ProbeError(Exception):
    """A user-facing error: one line that names the input and what to do next."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
