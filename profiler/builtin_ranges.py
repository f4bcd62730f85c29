"""The ranges a profiling session adds on its own, around calls that user code does not mark.

- every ``torch.distributed`` collective and point-to-point call: one range in domain
  ``communication`` (from :mod:`probe.engine_adapter.torch_comm`'s listener, with its op, group and
  bytes as payload);
- every dataloader fetch (``_BaseDataLoaderIter.__next__``): ``fetch`` in domain ``dataloader``;
- ``torch.save`` and (when loaded) ``torch.distributed.checkpoint.save``: in domain
  ``checkpoint``.

With ``after_init``, a script that creates its process group after the session started
(``probe profile -- script`` under torchrun) gets ``after_init()`` called right after its
``init_process_group``, which every rank calls together: the moment to measure clock offsets.

Nothing is installed when torch is not imported. :meth:`BuiltinRanges.remove` undoes every
wrapper and listener, in reverse order.

>>> ranges = BuiltinRanges(comm=False, dataloader=False, checkpoint=False)
>>> ranges.install(); ranges.remove()
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from probe.profiler.events import emit_complete


class BuiltinRanges:
    """Installs the built-in ranges a session asked for; see the module docstring."""

    def __init__(self, *, comm: bool = True, dataloader: bool = True, checkpoint: bool = True,
                 after_init: Callable[[], None] | None = None) -> None:
        self.comm = comm
        self.dataloader = dataloader
        self.checkpoint = checkpoint
        self.after_init = after_init
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        """Wrap what was asked for (only where torch is already imported)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        if self.comm:
            from probe.engine_adapter import torch_comm

            listener = _CommRanges()
            torch_comm.add_listener(listener)
            self._undo.append(lambda: torch_comm.remove_listener(listener))
        if self.dataloader:
            from torch.utils.data import dataloader as dl

            self._patch(dl._BaseDataLoaderIter, "__next__", "dataloader", "fetch")
        if self.checkpoint:
            self._patch(torch, "save", "checkpoint", "torch.save")
            dcp = sys.modules.get("torch.distributed.checkpoint")
            if dcp is not None and hasattr(dcp, "save"):
                self._patch(dcp, "save", "checkpoint", "torch.distributed.checkpoint.save")
        if self.after_init is not None:
            self._call_after_init(self.after_init)

    def remove(self) -> None:
        """Undo every wrapper and listener. Safe to call twice."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _call_after_init(self, after_init: Callable[[], None]) -> None:
        import torch.distributed as dist

        if not dist.is_available() or dist.is_initialized():
            return
        from torch.distributed import distributed_c10d as c10d

        orig = c10d.init_process_group

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = orig(*args, **kwargs)
            after_init()
            return result

        init_process_group.__wrapped__ = orig  # type: ignore[attr-defined]
        for owner in (c10d, dist):
            if getattr(owner, "init_process_group", None) is orig:
                setattr(owner, "init_process_group", init_process_group)
                self._undo.append(lambda owner=owner: setattr(owner, "init_process_group", orig))

    def _patch(self, owner: Any, attr: str, domain: str, name: str) -> None:
        orig = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return orig(*args, **kwargs)
            finally:
                emit_complete(name, domain, t0, time.perf_counter_ns())

        timed.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(owner, attr, timed)

        def undo() -> None:
            if getattr(owner, attr, None) is timed:
                setattr(owner, attr, orig)

        self._undo.append(undo)


class _CommRanges:
    """torch_comm listener: one ``communication`` range per collective/p2p call."""

    def on_comm_end(self, call: Any) -> None:
        emit_complete(call.op, "communication", call.start_ns, call.end_ns, call.payload())
