"""A dump of a script's run: what ``probe dump -- train.py`` switches on around the script.

Steps are the script's optimizer steps: step 0 starts when the script constructs its first
optimizer (what runs before, imports, model construction, moving the model and casting its
parameters, is set-up and is not dumped, as msprobe's debugger, started in the training loop,
does not see it; MindSpore: step 0 starts with the script), each
``optimizer.step()`` ends one, and after the last one a step is written only if the model
worked in it (an evaluation after training, say; not the training loop's logging of the last
loss: :meth:`~probe.dumper.recorder.DumpRecorder.step_did_work`). Under PyTorch the run's setup is
recorded too (``OUT/config/``, ``probe config-check``). The caller runs the script inside::

    with ScriptDump(out="runs/mine", framework="torch", level="mix"):
        run_script(["train.py", "--steps", "3"], "finished steps are written")
"""

from __future__ import annotations

from typing import Any

from probe.dumper.session import DumpSession
from probe.ground.frameworks import framework as framework_spec


class ScriptDump:
    """Every model the script runs, dumped from its first optimizer on (a context manager)."""

    def __init__(self, out: str, framework: str = "torch", fsync: str = "step", **options: Any) -> None:
        self.out = out
        self.framework = framework
        self.session = DumpSession(None, out=out, framework=framework, auto_step=True, fsync=fsync,
                                   **options)
        self._unwatch: Any = None
        self._setup: Any = None

    def __enter__(self) -> "ScriptDump":
        from probe.engine_adapter.steps import watch_first_optimizer

        self.session.start()
        self._unwatch = watch_first_optimizer(self.framework, self._setup_done)
        if framework_spec(self.framework).name == "torch":
            from probe.engine_adapter.run_config import watch_config

            self._setup = watch_config(self.out)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._unwatch is not None:
            self._unwatch()
        try:                            # (the step left open after the last one is not written)
            self.session.stop(explicit=exc[0] is None)  # a full disk: its one line, exit 2
        finally:
            if self._setup is not None:
                self._setup.close()

    def _setup_done(self) -> None:
        """The script constructed its first optimizer: what was recorded so far is set-up, not
        step 0 (its tensor files are removed); step 0 starts afresh."""
        rec = self.session.recorder
        if rec is None or rec.step != 0:
            return
        rec.discard_step()
        self.session.begin_step(0)
