"""The statistics writer writes a finished step during the next step's backward pass (when the
training thread is mostly in autograd's C++, not in the interpreter): with the Python backward
hooks, in the stretch the last step's backward spent longest without a hook (with the C++
capture, from its first gradient), at most WINDOW_WAIT_S later, and at once when a second step
waits or the dump is drained."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from probe.dumper import writer as dump_writer
from probe.dumper.session import DumpSession


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


class _Slow(torch.autograd.Function):
    """Identity whose backward takes a while: the longest stretch between two backward hooks."""

    events: list = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _Slow.events.append("slow backward")
        time.sleep(0.05)
        return g


class _SlowModule(nn.Module):
    def forward(self, x):
        return _Slow.apply(x)


def _log_hooks_and_windows(monkeypatch) -> list:
    """``_Slow.events`` cleared, with a "hook" for each of the recorder's backward hooks and a
    "window" for each window the writer is given, in the order they come; the backward hooks
    are the Python ones (the C++ capture's are replayed as the step ends, and the window opens
    at its first gradient: tests/engine_adapter/test_torch_grads.py)."""
    from probe.engine_adapter import torch_grads
    from probe.dumper.recorder import DumpRecorder

    monkeypatch.setattr(torch_grads, "load", lambda on_first: None)
    events = _Slow.events
    events.clear()
    for hook in ("module_backward", "parameter_grad"):
        original = getattr(DumpRecorder, hook)

        def logged(self, *args, _original=original, **kwargs):
            events.append("hook")
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(DumpRecorder, hook, logged)
    opened = dump_writer.DumpWriter.open_window
    monkeypatch.setattr(dump_writer.DumpWriter, "open_window",
                        lambda self: (events.append("window"), opened(self))[1])
    return events


def test_the_window_opens_at_the_hook_that_began_the_last_steps_longest_stretch(tmp_path, monkeypatch):
    events = _log_hooks_and_windows(monkeypatch)
    net = nn.Sequential(nn.Linear(4, 4), _SlowModule(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(3, 4)
    with DumpSession(net, out=tmp_path, store=False, auto_step=False) as session:
        for _ in range(3):
            events.append("step")
            net(x).sum().backward()
            session.step()
    steps = [[]]
    for e in events[1:]:
        if e == "step":
            steps.append([])
        else:
            steps[-1].append(e)
    # step 0 has no writer yet (and times its stretches); steps 1 and 2 open the window in
    # the hook right before the slow backward, after several others
    assert "window" not in steps[0]
    for later in steps[1:]:
        at = later.index("window")
        assert at > 2 and later[at - 1] == "hook" and later[at + 1] == "slow backward"


class _SlowForward(nn.Module):
    """Identity whose forward takes a while: under gradient accumulation, the stretch from one
    micro-batch's backward to the next one's holds it."""

    def forward(self, x):
        time.sleep(0.08)
        return x * 1.0


def test_a_stretch_holding_a_forward_call_does_not_open_the_window(tmp_path, monkeypatch):
    events = _log_hooks_and_windows(monkeypatch)
    net = nn.Sequential(nn.Linear(4, 4), _SlowModule(), nn.Linear(4, 4), _SlowForward(), nn.Linear(4, 1))
    x = torch.randn(3, 4)
    with DumpSession(net, out=tmp_path, store=False, auto_step=False) as session:
        for _ in range(3):
            events.append("step")
            for _micro_batch in range(2):       # two backward passes a step
                events.append("micro-batch")
                net(x).sum().backward()
            session.step()
    last = events[len(events) - 1 - events[::-1].index("step"):]
    # the window opens right before a micro-batch's slow backward (either one's: they are
    # as long), not at the first micro-batch's last hook, whose stretch holds the second
    # micro-batch's slower forward
    at = last.index("window")
    assert last[at + 1] == "slow backward"
