"""Shared for the simulator's tests: a calibration of this machine in a private cache folder."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def calibrated_cpu(tmp_path_factory):
    """This machine's CPU, calibrated on one thread into a folder of the test session's own
    (``PROBE_CACHE_DIR``), so ``--device cpu`` and validation find it; the threads restored."""
    from probe.simulator.calibrate import calibrate
    from probe.simulator.devices import save_calibrated

    mp = pytest.MonkeyPatch()
    mp.setenv("PROBE_CACHE_DIR", str(tmp_path_factory.mktemp("probe-cache")))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        device = calibrate("cpu", max_call_s=0.01, min_time_s=0.01)
        save_calibrated(device)
        yield device
    finally:
        torch.set_num_threads(threads)
        mp.undo()


@pytest.fixture
def probe_cli(capsys):
    """``probe ARGS`` run in this process (torch is imported once for the whole session):
    returns (exit code, stdout, stderr)."""
    from probe.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
