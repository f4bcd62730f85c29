"""What the agent side says from inside the user's process goes to ``logging`` (loggers under
``probe.monitor.agent``, children of ``probe``), never straight to stderr: the host program
decides where it shows (the CLI prints the ``probe`` logger to stderr)."""

from __future__ import annotations

import logging

import pytest

from probe.engine_adapter.callbacks import TrainContext
from probe.monitor.address import ADDR_ENV
from probe.monitor.agent.callback import MonitorAgentCallback
from probe.monitor.agent.numerics_callback import NumericsCallback


def _ctx(tmp_path) -> TrainContext:
    return TrainContext(rank=0, world_size=1, run="r", out_dir=str(tmp_path), engine="script",
                        preset="", device=None, model=None, optimizer=None, config=None,
                        max_steps=1, store=None)


@pytest.mark.parametrize("callback, says", [
    (MonitorAgentCallback, "probe monitor agent: no monitor address: set PROBE_MONITOR=host:port; "
                           "monitoring is off"),
    (NumericsCallback, "probe numerics: no torch model in this run; numerics are off")])
def test_a_callback_that_cannot_work_says_why_through_logging_not_print(callback, says, tmp_path, monkeypatch,
                                                                        caplog, capfd):
    monkeypatch.delenv(ADDR_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="probe"):
        callback().on_train_start(_ctx(tmp_path))
    assert [(r.name.startswith("probe.monitor.agent."), r.levelno, r.getMessage()) for r in caplog.records] == [
        (True, logging.WARNING, says)]
    assert capfd.readouterr().err == ""
