"""Predicted against measured on this machine: the bundled engine's peak memory and step time.

CPU peak: the c10 allocator's bytes from torch.profiler's memory events over a real run, within
10%. Step time: after calibration (one thread, the thread's CPU clock), within 30%. CUDA: where
a GPU is present, peak from torch.cuda.max_memory_allocated within 10% and step time within 25%;
skipped here otherwise.
"""

from __future__ import annotations

import pytest
import torch

from probe.simulator.validate import validate_cpu, validate_cuda


@pytest.mark.parametrize("preset", ["tiny", "mini", "small"])
def test_cpu_peak_memory_is_within_10_percent_of_a_real_run(preset):
    (check,) = validate_cpu(preset, time=False)
    assert check.what == "peak memory" and check.measured > 0
    assert check.ok, f"{preset}: predicted {check.predicted} vs measured {check.measured} ({check.error:+.1%})"


ATTEMPTS = 3


@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_cpu_step_time_is_within_30_percent_after_calibration(calibrated_cpu, preset):
    """Up to three validations: on this shared VM the same run's fastest step moves by up to
    1.7x between runs minutes apart (9.5 to 16.5 ms for ``tiny``; its ops replayed alone 9.2 ms
    every time), so one validation misses the 30% about one time in five with a right model;
    a model 30% off misses all three."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tries = []
    try:
        for _ in range(ATTEMPTS):
            memory, time = validate_cpu(preset, time_steps=6)
            assert memory.ok and time.what == "step time"
            tries.append(time)
            if time.ok:
                break
    finally:
        torch.set_num_threads(threads)
    assert tries[-1].ok, f"{preset}: " + "; ".join(
        f"predicted {t.predicted:.4f}s vs measured {t.measured:.4f}-{t.slowest:.4f}s ({t.error:+.1%})"
        for t in tries)


def test_cuda_validation_runs_where_a_gpu_is_and_skips_cleanly_here():
    checks = validate_cuda("tiny")
    if not torch.cuda.is_available():
        assert checks == []
        pytest.skip("no GPU on this machine: the CUDA checks are skipped")
    assert {c.what for c in checks} >= {"peak memory"}
    for check in checks:
        assert check.ok, f"{check.what}: {check.predicted} vs {check.measured} ({check.error:+.1%})"


def test_validate_command_prints_predicted_against_measured(probe_cli, calibrated_cpu):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code, out, _ = probe_cli("simulate", "--validate", "--preset", "tiny")
    finally:
        torch.set_num_threads(threads)
    assert "peak memory" in out and "step time" in out and "predicted" in out
    assert "CUDA checks were skipped" in out or "cuda" in out.lower()
    assert code in (0, 1)
