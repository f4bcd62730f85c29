"""When a flight recorder writes its ring: a non-finite loss or gradient norm, a spike, a signal.

Every rank decides from the same numbers (the bundled engine gives each rank every rank's loss
and the all-reduced gradient norm), so every rank writes its ring at the same step. A spike is
a value far above its own recent history by a robust score: ``(x - median) / (1.4826 * MAD)``
over the last :data:`WINDOW` finite values, once :data:`MIN_HISTORY` are there, and at least
:data:`MIN_RATIO` times the median (a smooth curve has a tiny MAD).

>>> d = SpikeDetector()
>>> [d.check(v) for v in [5.0, 4.9, 4.8, 4.85, 4.7, 4.6, 4.65]]
[None, None, None, None, None, None, None]
>>> round(d.check(9.5), 1)
31.7
>>> Triggers(ring_steps=4).check(step=3, losses=[2.0, float("nan")], grad_norm=1.0).kind
'nonfinite'
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

#: values of recent history a spike is scored against
WINDOW = 32
#: finite values needed before a spike can be called
MIN_HISTORY = 5
#: robust score (in MADs) above which a value is a spike
SPIKE_SCORE = 8.0
#: ... and how many times the median it must at least be
MIN_RATIO = 1.3
#: the most ring dumps one run writes (a long non-finite stretch writes once)
MAX_DUMPS = 4


class SpikeDetector:
    """The robust score of each new value against the ones before it; see the module docstring."""

    def __init__(self, window: int = WINDOW, score: float = SPIKE_SCORE) -> None:
        self.history: deque[float] = deque(maxlen=window)
        self.score = score

    def check(self, value: float) -> float | None:
        """The value's score when it is a spike, else None; a finite value joins the history
        (a spike too: a new level is the history after a while)."""
        if value is None or not math.isfinite(value):
            return None
        hist = sorted(self.history)
        self.history.append(value)
        if len(hist) < MIN_HISTORY:
            return None
        median = _median(hist)
        mad = _median(sorted(abs(v - median) for v in hist))
        spread = max(1.4826 * mad, 1e-3 * abs(median), 1e-12)
        z = (value - median) / spread
        if z >= self.score and value >= MIN_RATIO * median:
            return z
        return None


def _median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else 0.5 * (sorted_values[mid - 1] + sorted_values[mid])


@dataclass
class Trigger:
    kind: str           # nonfinite | spike | signal | exception | request
    step: int
    reason: str


class Triggers:
    """The triggers of one rank: :meth:`check` after each step."""

    def __init__(self, ring_steps: int, max_dumps: int = MAX_DUMPS) -> None:
        self.ring_steps = ring_steps
        self.max_dumps = max_dumps
        self.dumps = 0
        self._loss: dict[int, SpikeDetector] = {}
        self._norm = SpikeDetector()
        self._was_finite = True
        self._last_spike = -10 ** 9
        self.signalled = False

    def check(self, step: int, losses: Sequence[float] | None, grad_norm: float | None) -> Trigger | None:
        """The trigger of ``step`` (None: none), from every rank's loss and the gradient norm."""
        losses = [float(v) for v in (losses or []) if v is not None]
        found: Trigger | None = None
        bad = [r for r, v in enumerate(losses) if not math.isfinite(v)]
        norm_bad = grad_norm is not None and not math.isfinite(grad_norm)
        finite = not bad and not norm_bad
        if not finite and self._was_finite:
            what = []
            if bad:
                who = f"rank {bad[0]}" if len(bad) == 1 else "ranks " + ",".join(map(str, bad))
                what.append(f"loss {losses[bad[0]]} on {who}" if len(losses) > 1 else f"loss {losses[bad[0]]}")
            if norm_bad:
                what.append(f"gradient norm {grad_norm}")
            found = Trigger("nonfinite", step, f"step {step}: {' and '.join(what)}")
        self._was_finite = finite
        spikes = []
        for r, v in enumerate(losses):
            z = self._loss.setdefault(r, SpikeDetector()).check(v)
            if z is not None:
                spikes.append(f"loss {v:.4g}{f' on rank {r}' if len(losses) > 1 else ''} "
                              f"(robust score {z:.0f} over the last {WINDOW} steps)")
        z = self._norm.check(grad_norm) if grad_norm is not None else None
        if z is not None:
            spikes.append(f"gradient norm {grad_norm:.4g} (robust score {z:.0f})")
        if found is None and spikes and step - self._last_spike >= self.ring_steps:
            self._last_spike = step
            found = Trigger("spike", step, f"step {step}: spike: {'; '.join(spikes)}")
        if found is None and self.signalled:
            found = Trigger("signal", step, f"step {step}: SIGUSR1")
        self.signalled = False
        if found is not None:
            if self.dumps >= self.max_dumps:
                return None
            self.dumps += 1
        return found
