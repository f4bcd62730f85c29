"""Rank 0's progress while the bundled engine trains: a bar on a terminal, plain lines in a pipe.

On a terminal (stderr a TTY) a tqdm bar shows the step, the loss and the step time. Anywhere
else (a pipe, a file, CI) a plain line is written for the first step, every ``every`` steps,
whenever ``interval_s`` passed since the last line, and for the last step, so a log shows the
run going on without carriage returns:

>>> import io
>>> out = io.StringIO()
>>> p = Progress(total=25, label="reference/tiny x1", every=10, stream=out, bar=False)
>>> for step in range(25):
...     p.update(step, loss=5.0 - step / 10, step_ms=12.5)
>>> p.close()
>>> print(out.getvalue(), end="")
step 0 (1/25): loss 5.0000, 12.5 ms/step [reference/tiny x1]
step 9 (10/25): loss 4.1000, 12.5 ms/step [reference/tiny x1]
step 19 (20/25): loss 3.1000, 12.5 ms/step [reference/tiny x1]
step 24 (25/25): loss 2.6000, 12.5 ms/step [reference/tiny x1]

The loss shown is the mean over the ranks (rank 0 has every rank's loss after the step's
all-reduce). Progress goes to stderr: stdout keeps the step table and the summary.
"""

from __future__ import annotations

import sys
import time
from typing import IO

#: default: a line every this many steps (``--log-every``)
EVERY = 10
#: and at least one line every this many seconds (when steps are slow)
INTERVAL_S = 10.0


class Progress:
    """Shows training progress; ``bar``: None = a tqdm bar when ``stream`` is a terminal."""

    def __init__(self, total: int, label: str, *, every: int = EVERY, interval_s: float = INTERVAL_S,
                 stream: IO[str] | None = None, bar: bool | None = None) -> None:
        self.total = total
        self.label = label
        self.every = max(1, int(every))
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self._bar = None
        if bar:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=label, unit="step", file=self.stream, leave=False)
        self._last_line = time.monotonic()

    def update(self, step: int, loss: float, step_ms: float) -> None:
        """Step ``step`` (0-based) finished with ``loss`` in ``step_ms`` milliseconds."""
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss:.4f}", ms=f"{step_ms:.1f}", refresh=False)
            self._bar.update(1)
            return
        done = step + 1
        now = time.monotonic()
        if (step == 0 or done % self.every == 0 or done >= self.total
                or now - self._last_line >= self.interval_s):
            self._last_line = now
            print(f"step {step} ({done}/{self.total}): loss {loss:.4f}, {step_ms:.1f} ms/step "
                  f"[{self.label}]", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """One line (a non-finite loss) that does not break the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
