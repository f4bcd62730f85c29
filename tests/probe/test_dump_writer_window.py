"""The statistics writer writes a finished step during the next step's backward pass (when the
training thread is mostly in autograd's C++, not in the interpreter), at most WINDOW_WAIT_S
later, and at once when a second step waits or the dump is drained."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from probe import dump_writer
from probe.session import DumpSession


def _written(out: Path, step: int) -> bool:
    return (out / f"step{step}" / "rank0" / "dump.json").exists()


def _wait_for(out: Path, step: int, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _written(out, step):
            return True
        time.sleep(0.02)
    return False


def test_a_step_is_written_in_the_next_steps_backward_not_before(tmp_path, monkeypatch):
    monkeypatch.setattr(dump_writer, "WINDOW_WAIT_S", 60.0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(3, 4)
    with DumpSession(net, out=tmp_path, store=False, auto_step=False) as session:
        net(x).sum().backward()
        session.step()                      # step 0 handed to the writer
        y = net(x).sum()                    # step 1's forward: step 0 waits
        time.sleep(0.3)
        assert not _written(tmp_path, 0)
        y.backward()                        # step 1's backward opens the window
        assert _wait_for(tmp_path, 0)
    assert _written(tmp_path, 1)            # stop() drains the last step


def test_a_forward_only_step_is_written_when_the_window_wait_runs_out(tmp_path, monkeypatch):
    monkeypatch.setattr(dump_writer, "WINDOW_WAIT_S", 0.2)
    net = nn.Linear(4, 2)
    with torch.no_grad(), DumpSession(net, out=tmp_path, store=False, auto_step=False) as session:
        net(torch.randn(2, 4))
        session.step()
        assert _wait_for(tmp_path, 0)       # no backward comes: written ~0.2 s later
        assert not _written(tmp_path, 1)


def test_a_second_finished_step_has_the_first_written_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(dump_writer, "WINDOW_WAIT_S", 60.0)
    net = nn.Linear(4, 2)
    with torch.no_grad(), DumpSession(net, out=tmp_path, store=False, auto_step=False) as session:
        net(torch.randn(2, 4))
        session.step()
        time.sleep(0.3)                     # the writer holds step 0, waiting for a window
        net(torch.randn(2, 4))
        session.step()                      # two steps waiting: no window to wait for
        assert _wait_for(tmp_path, 0) and _wait_for(tmp_path, 1)
