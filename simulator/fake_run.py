"""Run code with every tensor it makes fake, traced, stopping after a number of optimizer steps.

Inside :class:`FakeRun`:

1. a ``FakeTensorMode`` makes every tensor a fake one (shape, dtype, device; no storage);
   tensors made before (real ones) are accepted as inputs;
2. an :class:`~probe.simulator.trace.OpTracer` above it records every op and storage, with a
   :class:`~probe.simulator.placeholders.ValueReader` answering value reads;
3. with ``world_size > 1`` and no process group yet, ``torch.distributed`` gets one of the
   ``fake`` backend (rank 0 of ``world_size``; collectives return at once), and each collective
   is recorded through :mod:`probe.engine_adapter.torch_comm`; the environment says
   ``RANK=0 WORLD_SIZE=N`` for code that reads it, and the code's own
   ``init_process_group``/``destroy_process_group`` calls leave the fake group standing;
   ``DistributedDataParallel`` wraps a module without its C++ reducer (which reads values): the
   gradient sync it would run is computed from the layout instead;
4. after ``max_steps`` optimizer steps (``torch.optim``'s global step post hook),
   :class:`StopSimulation` ends the run from inside ``optimizer.step()``;
5. ``Module.to()``/``.half()`` work on fake parameters: torch swaps a fake parameter's contents
   and refuses when ``FakeTensorMode``'s own memo holds a weak reference to it
   (pytorch/pytorch#186796, #170781), so the swap forgets that memo entry first.

Everything is restored on exit, errors included.

>>> import torch
>>> with FakeRun(max_steps=1) as run:
...     model = torch.nn.Linear(1024, 1024)
...     opt = torch.optim.SGD(model.parameters(), lr=0.1)
...     for step in range(100):
...         model(torch.randn(8, 1024)).sum().backward()
...         opt.step()
>>> run.steps, run.stopped, run.tracer.trace.storage_bytes[0]
(1, True, 4194304)
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from probe.simulator.placeholders import ValueReader
from probe.simulator.trace import OpTracer


class StopSimulation(BaseException):
    """Raised from the optimizer's step hook when the requested steps are done."""


class FakeRun:
    """The fake, traced world of one simulated rank (see the module docstring)."""

    def __init__(self, *, max_steps: int | None = None, world_size: int = 1,
                 script: str | None = None, quiet_reads: bool = False,
                 signatures: bool = False) -> None:
        self.max_steps = max_steps
        self.world_size = world_size
        self.reader = ValueReader(script=script, quiet=quiet_reads)
        self.tracer = OpTracer(reader=self.reader, signatures=signatures)
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.steps = 0
        self.stopped = False
        self._undo: list[Any] = []

    def __enter__(self) -> "FakeRun":
        try:
            self._patch_swap()
            self._fake_process_group()
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.fake.__enter__()
            self._undo.append(lambda: self.fake.__exit__(None, None, None))
            self.tracer.__enter__()
            self._undo.append(lambda: self.tracer.__exit__(None, None, None))
            handle = register_optimizer_step_post_hook(self._stepped)   # after the tracer's own
            self._undo.append(handle.remove)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> bool:
        self._restore()
        if isinstance(error, StopSimulation):
            self.stopped = True
            return True
        return False

    def _restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.max_steps is not None and self.steps >= self.max_steps:
            raise StopSimulation()

    def _patch_swap(self) -> None:
        import torch.utils

        original = torch.utils.swap_tensors
        memo = self.fake.fake_tensor_converter.tensor_memo

        def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
            for key in [k for k, v in list(memo.items()) if v is t1 or v is t2]:
                del memo[key]
            original(t1, t2)

        torch.utils.swap_tensors = swap_tensors
        self._undo.append(lambda: setattr(torch.utils, "swap_tensors", original))

    def _fake_process_group(self) -> None:
        import torch.distributed as dist

        if self.world_size <= 1 or not dist.is_available() or dist.is_initialized():
            return
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(self.world_size))
        self._undo.append(lambda: _restore_env(saved))
        init, destroy = dist.init_process_group, dist.destroy_process_group
        init("fake", rank=0, world_size=self.world_size)
        self._undo.append(destroy)
        dist.init_process_group = dist.destroy_process_group = _already_done
        self._undo.append(lambda: (setattr(dist, "init_process_group", init),
                                   setattr(dist, "destroy_process_group", destroy)))
        from probe.engine_adapter import torch_comm

        listener = torch_comm.add_listener(_CommToTrace(self.tracer, self.world_size))
        self._undo.append(lambda: torch_comm.remove_listener(listener))
        import torch.nn.parallel as parallel
        import torch.nn.parallel.distributed as distributed

        ddp = parallel.DistributedDataParallel
        parallel.DistributedDataParallel = distributed.DistributedDataParallel = _ReplicaModule
        self._undo.append(lambda: (setattr(parallel, "DistributedDataParallel", ddp),
                                   setattr(distributed, "DistributedDataParallel", ddp)))


class _ReplicaModule(torch.nn.Module):
    """Stands for ``DistributedDataParallel`` on fake tensors (its C++ reducer reads values):
    the wrapped module as ``.module``, called as it is; the gradient all-reduce DDP would run is
    the simulation's data-parallel sync (:mod:`probe.simulator.ranks`)."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


class _CommToTrace:
    """A :mod:`probe.engine_adapter.torch_comm` listener that records each collective in the trace."""

    def __init__(self, tracer: OpTracer, world_size: int) -> None:
        self.tracer, self.world_size = tracer, world_size

    def on_comm_end(self, call: Any) -> None:
        size = call.group_size or self.world_size
        self.tracer.comm(call.op, "dp", size, call.nbytes or 0)


def _already_done(*args: Any, **kwargs: Any) -> None:
    """The code's own ``init_process_group``/``destroy_process_group``: the fake group stands."""


def _restore_env(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
