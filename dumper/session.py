"""The dump's Python API: ``probe.start()/step()/stop()`` and the ``probe.dump(...)`` context manager.

A :class:`DumpSession` attaches an engine adapter's hooks to a model (``module`` level), to the
framework's APIs (``api`` level) or both (``mix``), records every selected step and rank, and
writes ``OUT/step{N}/rank{R}/dump.json, construct.json, stack.json`` (msprobe's format) plus
the Arrow store under ``OUT/store`` as each step ends. With ``fsync="step"`` (the default) each
finished step's files are also forced to disk, off the training thread; ``"never"`` leaves that
to the operating system. Steps come from the optimizer
(``auto_step=True``, the default) or from your own :func:`step` calls (``auto_step=False``).

Example::

    import probe
    with probe.dump(model, out="runs/dump", level="mix", steps="0-1"):
        for batch in data:
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()          # ends a step
            optimizer.zero_grad()

or, step by step::

    probe.start(model, out="runs/dump", auto_step=False)
    ...; probe.step()
    probe.stop()
"""

from __future__ import annotations

import atexit
import logging
from typing import Any, Sequence

from probe.ground.errors import ProbeError
from probe.dumper.config import DumpConfig
from probe.dumper.recorder import DumpRecorder

log = logging.getLogger(__name__)

_current: "DumpSession | None" = None


def _selection(value: Any, what: str) -> list[int] | None:
    if value is None or isinstance(value, (list, tuple, set, range)):
        return None if value is None else sorted({int(v) for v in value})
    if isinstance(value, int):
        return [value]
    from probe.ground.selection import parse_selection
    return parse_selection(str(value), what=what)


class DumpSession:
    """One dump: an adapter, a recorder and (optionally) a store writer. See the module docstring."""

    def __init__(self, model: Any = None, *, out: str = "dump", level: str = "module",
                 task: str = "statistics", steps: Any = None, ranks: Any = None,
                 scope: str | None = None, names: Sequence[str] | str | None = None,
                 framework: str = "torch", auto_step: bool = True, store: Any = True,
                 rank: int | None = None, run: str | None = None, stack: bool = True,
                 first_step: int | None = 0, quiet: bool = False, store_flush_s: float = 1.0,
                 fsync: str = "step", max_hits: int = 1, golden: str = "cpu-fp64",
                 tensor_format: str = "msprobe") -> None:
        if isinstance(names, str):
            names = [n for n in names.split(",") if n.strip()]
        self.config = DumpConfig(out=str(out), level=level, task=task,
                                 steps=_selection(steps, "--steps"), ranks=_selection(ranks, "--ranks"),
                                 scope=scope, names=names, stack=stack, run=run,
                                 store_flush_s=store_flush_s, fsync=fsync, max_hits=max_hits,
                                 golden=golden, tensor_format=tensor_format)
        self.model = model
        self.framework = framework
        self.auto_step = auto_step
        self._store_arg = store
        self._rank_arg = rank
        self.first_step = first_step
        self.quiet = quiet
        self.adapter: Any = None
        self.recorder: DumpRecorder | None = None
        self.store: Any = None
        self._own_store = False
        #: the full disk that stopped the dump's writing (:meth:`stop` raises it once), or None
        self.disk_full: Any = None
        self._hooked = False
        self._detached = False
        self._gc: Any = None

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> "DumpSession":
        """Attach the hooks and start recording step ``first_step`` (None: wait for :meth:`begin_step`)."""
        from probe.engine_adapter.base import get_adapter

        if self.recorder is not None:
            return self
        self.adapter = get_adapter(self.framework)
        rank = self.adapter.rank() if self._rank_arg is None else int(self._rank_arg)
        if self._store_arg is True:
            from probe.collectors.store import StoreWriter
            self.store = StoreWriter(self.config.out, rank=rank, run=self.config.run,
                                     fsync=self.config.fsync)
            self._own_store = True
        elif self._store_arg not in (None, False):
            self.store = self._store_arg
        self.recorder = _recorder_class(self.config.task)(self.adapter, self.config, rank=rank,
                                                          store=self.store)
        if self.config.ranks is None or rank in self.config.ranks:
            from probe.dumper.gc_policy import GcPolicy
            self._gc = GcPolicy().start()
            self._attach()
        if self.first_step is not None:
            self.recorder.begin_step(self.first_step)
        atexit.register(self.stop, explicit=False)   # a script that forgets stop() gets its last step
        return self

    def _attach(self) -> None:
        level = self.config.level
        rec = self.recorder
        if level in ("module", "mix"):
            if self.model is not None:
                self._attach_model(self.model)
            else:
                self.adapter.watch_models(self._attach_model)
        if level in ("api", "mix"):
            self.adapter.attach_api(rec)
        if self.auto_step:
            self.adapter.watch_steps(self.step)
        self._hooked = True
        if not self.quiet:
            for note in self.adapter.notes():
                log.warning("probe dump: %s", note)

    def _attach_model(self, model: Any) -> None:
        prefix = self.adapter.root_prefix() if hasattr(self.adapter, "root_prefix") else ""
        before = len(self.adapter.notes())
        self.adapter.attach_modules(model, self.recorder, prefix=prefix)
        if self._hooked and not self.quiet:
            for note in self.adapter.notes()[before:]:
                log.warning("probe dump: %s", note)

    def begin_step(self, step: int) -> None:
        """Start recording ``step`` (a no-op for steps not selected)."""
        if self.recorder is not None:
            self.recorder.begin_step(step)

    def end_step(self) -> None:
        """Write the current step; detach the hooks once the last selected step is written."""
        rec = self.recorder
        if rec is None:
            return
        rec.end_step()
        last = rec.last_step
        if last is not None and rec.step >= last and self._hooked and not self._detached:
            self._detach()

    def step(self) -> None:
        """End the current step and begin the next one."""
        rec = self.recorder
        if rec is None:
            return
        current = rec.step
        self.end_step()
        rec.begin_step(current + 1)

    def stop(self, explicit: bool = True) -> None:
        """Write the step in flight, remove every hook, close the store. Safe to call twice.

        When the disk filled while the dump wrote, the writing stopped there (the steps before
        are whole) and this raises that :class:`probe.ground.files.DiskFull` (one line; logged
        instead when called at exit, ``explicit=False``; kept in :attr:`disk_full` either way).

        A step in flight after step 0 in which the model did no work is not written: after the
        last optimizer step (or ``step()``) the next step is open, and nothing ran in it but the
        training loop's logging, if anything (a 4-step script has 4 steps, not a fifth holding
        the last loss's ``.item()``); see :meth:`DumpRecorder.step_did_work`."""
        global _current
        rec = self.recorder
        if rec is not None and rec.active and rec.step > 0 and not rec.step_did_work():
            rec.discard_step()
        if rec is not None and rec.active:
            rec.end_step()
        if self.adapter is not None and not self._detached:
            self._detach()
        if rec is not None:
            rec.drain()
        atexit.unregister(self.stop)
        full = getattr(rec, "disk_full", None)
        if self.store is not None and self._own_store:
            try:
                self.store.close()
            except Exception as e:  # noqa: BLE001
                if rec is not None and full is None:    # (a full disk is said once, below)
                    rec.report_error("closing the store", e)
            self.store = None
        if _current is self:
            _current = None
        if full is not None and self.disk_full is None:
            # the disk filled while the dump wrote: the steps written before are whole; say it
            # in one line (exit 2 from the command line) rather than end as if all was written
            self.disk_full = full
            if explicit:
                raise full
            log.error(f"probe dump: {full}")

    def _detach(self) -> None:
        self._detached = True
        self.adapter.detach()
        if self._gc is not None:
            self._gc.stop()
            self._gc = None

    def notes(self) -> list[str]:
        return self.adapter.notes() if self.adapter is not None else []

    @property
    def steps_written(self) -> list[int]:
        return list(self.recorder.steps_written) if self.recorder else []

    def __enter__(self) -> "DumpSession":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(explicit=exc[0] is None)      # (the body's own error is not masked)


def _recorder_class(task: str) -> type:
    """The recorder of a task: ``check`` and ``overflow`` watch calls instead of writing them."""
    if task == "check":
        from probe.dumper.check import CheckRecorder
        return CheckRecorder
    if task == "overflow":
        from probe.dumper.overflow import OverflowRecorder
        return OverflowRecorder
    return DumpRecorder


def start(model: Any = None, **kwargs: Any) -> DumpSession:
    """Start dumping ``model`` (or every model the script runs, when None); see :class:`DumpSession`.

    >>> import torch, tempfile, probe
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 2))
    >>> s = probe.start(net, out=tempfile.mkdtemp(), auto_step=False, store=False)
    >>> _ = net(torch.ones(1, 4)); probe.stop()
    >>> s.steps_written
    [0]
    """
    global _current
    if _current is not None:
        raise ProbeError("probe.start(): a dump is already running; call probe.stop() first")
    session = DumpSession(model, **kwargs)
    session.start()
    _current = session
    return session


def step() -> None:
    """End the current step of the running dump and begin the next."""
    if _current is None:
        raise ProbeError("probe.step(): no dump is running; call probe.start(model) first")
    _current.step()


def stop() -> None:
    """Stop the running dump (writes the step in flight). Does nothing when none runs."""
    if _current is not None:
        _current.stop()


def dump(model: Any = None, **kwargs: Any) -> DumpSession:
    """A dump as a context manager: ``with probe.dump(model, out=...): ...``."""
    return DumpSession(model, **kwargs)
