"""What ``--flight-recorder K`` adds to ``probe train``, ``probe dump`` and ``probe profile``."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

#: what a flight recorder writes at the top of OUT (claimed with ground.outdir.claim)
FLIGHT_ENTRIES = ["step[0-9]*", "flight_recorder"]


def flight_callbacks(steps: int | None, level: str = "module", stop: bool = False) -> tuple:
    """The engine's callbacks of a flight recorder of ``steps`` steps (none when None)."""
    if steps is None:
        return ()
    from probe.dumper.flight import FlightCallback
    from probe.engine_adapter.callbacks import CallbackSpec

    return (CallbackSpec(FlightCallback, {"steps": steps, "level": level, "stop": stop}),)


def claim_flight(out: str, verb: str, steps: int | None, force: bool) -> None:
    """Claim the entries the ring's dump may write (nothing without a recorder)."""
    if steps is None:
        return
    from probe.ground.outdir import claim

    claim(out, verb, FLIGHT_ENTRIES, force=force)


@contextlib.contextmanager
def script_recorder(steps: int | None, out: str, level: str = "module", stop: bool = False,
                    framework: str = "torch") -> Iterator[Any]:
    """A flight recorder around a script run in this process (nothing when ``steps`` is None)."""
    if steps is None:
        yield None
        return
    from probe.dumper.flight import FlightRecorder

    recorder = FlightRecorder(None, steps=steps, out=out, level=level, stop=stop, framework=framework)
    recorder.start()
    error: BaseException | None = None
    try:
        yield recorder
    except Exception as e:  # noqa: BLE001 - written, then raised on
        error = e
        raise
    finally:
        recorder.stop(error)
