"""The one error type users see, and the exit codes of the command line.

Every package raises :class:`ProbeError` (or a subclass) for bad input: a corrupt file, an
unknown preset, a malformed selection. The command line prints it as a single line, never a
traceback, and exits with its ``exit_code``.

>>> try:
...     raise ProbeError("runs/x/dump.json: truncated JSON at byte 120")
... except ProbeError as e:
...     print(e)
runs/x/dump.json: truncated JSON at byte 120

Exit codes (every verb): :data:`EXIT_OK` 0 done; :data:`EXIT_FAILED` 1 a check failed or a
run/script failed; :data:`EXIT_USAGE` 2 bad input or usage; :data:`EXIT_INTERNAL` 3 an internal
error; :data:`EXIT_NONFINITE` 4 the bundled engine's loss or gradient norm turned NaN/Inf
(``--allow-nan`` trains on and exits 0); :data:`EXIT_INTERRUPTED` 130 interrupted.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
#: the bundled engine's loss or gradient norm was NaN/Inf at some step (no ``--allow-nan``)
EXIT_NONFINITE = 4
EXIT_INTERRUPTED = 130


class ProbeError(Exception):
    """A user-facing error: one line that names the input and what to do next."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
