"""Record a run's setup: what must be equal for two runs to train alike.

One JSON file per rank, ``OUT/config/rank{R}.json``, written when training starts and again
when the first batches have been seen; ``probe config-check A B`` (:mod:`probe.compare.config_diff`)
compares two runs' files. Its sections:

1. ``run``: rank and world size; who, where and when (pid, host, kernel, time, argv, cwd,
   executable, the run's length): never a cause of divergence, but the world size;
2. ``platform``: Python, torch's CUDA/HIP/cuDNN/NCCL, the CPU's vector capability, the
   model's device and the GPUs' names, torch's thread count;
3. ``packages``: every installed distribution and its version;
4. ``environment``: every environment variable; the value of a name holding TOKEN, KEY,
   SECRET, PASSWORD, PASSWD or CREDENTIAL is ``<redacted>``, the run folder's path ``{OUT}``;
5. ``determinism``: the seed when the caller knows it, torch's initial seed and digests of the
   torch (and CUDA, numpy, Python) random states, the deterministic-algorithm, cuDNN and TF32
   flags, ``CUBLAS_WORKSPACE_CONFIG`` and ``PYTHONHASHSEED``; taken when the model is recorded
   (a script has seeded and built by then);
6. ``hyperparameters``: each optimizer's class and param_groups (the params replaced by their
   count), plus what the caller adds (the bundled engine's model config, engine, faults);
7. ``model``: the module tree, and each parameter's and buffer's dtype, shape and checksum
   before the first optimizer step (:mod:`probe.engine_adapter.checksum`: on the device, two
   integers per tensor to the host);
8. ``batches``: dtype, shape and checksum of the root model's tensor inputs at its first
   forward in each of steps 0 to ``batch_steps - 1`` (a forward pre-hook, removed afterwards).

Three ways in: the bundled engine's loop (:class:`RunConfigCallback`, in every run),
:func:`record_config` in your own script, and :func:`watch_config` for a script run by
``probe dump -- SCRIPT`` or ``probe config-check --record OUT -- SCRIPT`` (the first model to run
forward and every optimizer that steps). Nothing is recorded inside a fake-tensor run (the
simulator's).

>>> import tempfile, torch, json, os
>>> model = torch.nn.Linear(4, 2)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> out = tempfile.mkdtemp()
>>> rec = record_config(model, opt, out)
>>> for _ in range(2):
...     model(torch.ones(3, 4)).sum().backward(); opt.step()
>>> rec.close()
>>> data = json.load(open(os.path.join(out, "config", "rank0.json")))
>>> sorted(data["model"]["parameters"]), [b["step"] for b in data["batches"]]
(['bias', 'weight'], [0, 1])
>>> data["hyperparameters"]["optimizers"][0]["param_groups"][0]["lr"]
0.1
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
from typing import Any, Iterator

import torch

from probe.engine_adapter.callbacks import TrainCallback, TrainContext
from probe.engine_adapter.checksum import Checksummer, to_hex
from probe.engine_adapter.config_format import CONFIG_DIRNAME, FORMAT, VERSION, config_path
from probe.engine_adapter.run_facts import (determinism_flags, environment, packages, platform_info,
                                      random_state, run_info)

log = logging.getLogger(__name__)

#: steps whose first batch is recorded
BATCH_STEPS = 3
#: at most this many tensors of one batch are recorded
MAX_INPUTS = 32
#: what of the bundled engine's ``TrainContext.extra`` shapes training (other keys are callbacks' notes)
ENGINE_SETUP = ("faults", "compiled", "dtype")


class ConfigRecorder:
    """One rank's setup record, filled by ``add_*`` calls and written by :meth:`write`.

    ``rank``/``world_size`` None: taken from ``torch.distributed`` (or ``RANK``/``WORLD_SIZE``)
    when the model is added, so a script that initialises its process group late is placed right.
    """

    def __init__(self, out_dir: str, rank: int | None = None, world_size: int | None = None, *,
                 run: str | None = None, batch_steps: int = BATCH_STEPS) -> None:
        self.out_dir = os.path.abspath(out_dir)
        self.rank, self.world_size = rank, world_size
        self.batch_steps = batch_steps
        self.step = 0
        self.data: dict[str, Any] = {
            "format": FORMAT, "version": VERSION,
            "run": run_info(self.out_dir, run),
            "platform": platform_info(),
            "packages": packages(),
            "environment": environment(self.out_dir),
            "determinism": determinism_flags(),
        }
        self._sums = Checksummer()
        self._late_handles: list[Any] = []      # removed at close() only (see watch_config)
        self._batches: list[dict[str, Any]] = []
        self._batch_sums: list[torch.Tensor | None] = []
        self._optimizers: list[int] = []
        self._handles: list[Any] = []
        self._failed = False
        self._closed = False
        atexit.register(self.close)

    # ----------------------------------------------------------------- what is recorded
    def add_seed(self, seed: int | None) -> None:
        """The seed the run was started with, when the caller knows it."""
        if seed is not None:
            self.data["determinism"]["seed"] = int(seed)

    def add_hyperparameters(self, **values: Any) -> None:
        """Values that shape training besides the optimizer's (model config, world size ...)."""
        self.data.setdefault("hyperparameters", {}).update({k: _plain(v) for k, v in values.items()})

    def add_optimizer(self, optimizer: Any) -> None:
        """The optimizer's class and param_groups, each group's params replaced by their count."""
        if id(optimizer) in self._optimizers:
            return
        self._optimizers.append(id(optimizer))
        groups = []
        for group in optimizer.param_groups:
            params = group.get("params", [])
            entry = {k: _plain(v) for k, v in group.items() if k != "params"}
            entry["params"] = len(params)
            entry["numel"] = sum(int(p.numel()) for p in params)
            groups.append(entry)
        self.data.setdefault("hyperparameters", {}).setdefault("optimizers", []).append(
            {"class": type(optimizer).__name__, "param_groups": groups})

    def add_model(self, model: torch.nn.Module, *, batches: bool = True) -> None:
        """The random state now, the module tree, parameter and buffer checksums; with
        ``batches``, a pre-hook that records the inputs of the model's first forward per step."""
        self._place()
        self.data["determinism"].update(random_state())
        params = list(model.named_parameters())
        buffers = list(model.named_buffers())
        sums = to_hex([self._sums(t) for _, t in params + buffers])
        device = next((str(t.device) for _, t in params + buffers), "none")
        self.data["platform"]["device"] = device
        self.data["model"] = {
            "class": type(model).__name__,
            "modules": [[name, type(m).__name__] for name, m in model.named_modules()],
            "parameters": {name: _describe(t, s) | {"requires_grad": bool(t.requires_grad)}
                           for (name, t), s in zip(params, sums[:len(params)])},
            "buffers": {name: _describe(t, s) for (name, t), s in zip(buffers, sums[len(params):])},
        }
        if batches and self.batch_steps > 0:
            self._handles.append(model.register_forward_pre_hook(self._on_forward, with_kwargs=True))

    # ----------------------------------------------------------------- steps and batches
    def record_batch(self, args: tuple, kwargs: dict) -> None:
        """Checksums of the tensors in ``args``/``kwargs`` as this step's first batch (once a step)."""
        if self._failed or self.step >= self.batch_steps or any(
                b["step"] == self.step for b in self._batches):
            return
        inputs = []
        for path, t in _tensors(("args", args), ("kwargs", kwargs)):
            if len(inputs) == MAX_INPUTS:
                break
            inputs.append({"path": path, **_describe(t, None)})
            self._batch_sums.append(self._sums(t))
        self._batches.append({"step": self.step, "inputs": inputs})

    def _on_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        try:
            self.record_batch(args, kwargs)
        except Exception as e:  # noqa: BLE001 - recording must never break the forward
            self._fail("the first batches", e)
        return None

    def step_ended(self, step: int) -> None:
        """Step ``step`` ended: write and stop watching once the last recorded step is done."""
        self.step = step + 1
        if self.step >= self.batch_steps and self._handles:
            self._remove_hooks()
            self.write()
            self._sums = Checksummer()     # its tables (up to 32 MiB) are not kept for the run

    # ----------------------------------------------------------------- output
    def write(self) -> str:
        """Write ``OUT/config/rank{R}.json`` (atomically); returns its path."""
        self._place()
        pending = [i for i, s in enumerate(self._batch_sums) if s is not None]
        if pending:
            flat = [x for b in self._batches for x in b["inputs"]]
            for i, h in zip(pending, to_hex([self._batch_sums[i] for i in pending])):
                flat[i]["checksum"] = h
            self._batch_sums = [None] * len(self._batch_sums)
        self.data["batches"] = self._batches
        path = config_path(self.out_dir, self.rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1, sort_keys=True, allow_nan=False)
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        """Remove the hooks and write what was recorded. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._remove_hooks()
        late, self._late_handles = self._late_handles, []
        for h in late:
            h.remove()
        try:
            self.write()
        except OSError as e:
            log.warning(f"probe: the run's setup could not be written to {self.out_dir}/{CONFIG_DIRNAME} "
                        f"({e.strerror or e})")

    def _place(self) -> None:
        if self.rank is None or self.world_size is None:
            rank, world = _distributed()
            self.rank = rank if self.rank is None else self.rank
            self.world_size = world if self.world_size is None else self.world_size
        self.data["run"].update(rank=self.rank, world_size=self.world_size)

    def _remove_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def _fail(self, what: str, e: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._remove_hooks()
            log.warning(f"probe: recording {what} of the run's setup failed ({type(e).__name__}: {e}); "
                        "training goes on without it")


# --------------------------------------------------------------------------- ways in
def record_config(model: torch.nn.Module, optimizer: Any = None, out: str = "runs/config", *,
                  seed: int | None = None, batch_steps: int = BATCH_STEPS) -> ConfigRecorder:
    """Record this process's setup for ``probe config-check``: call it once the model and the
    optimizer are built, before training. Steps are counted by ``optimizer`` (one or a list).

    Writes ``out/config/rank{R}.json`` now, again after ``batch_steps`` steps, and at exit
    (or at ``close()``). Example::

        rec = record_config(model, optimizer, "runs/a", seed=1234)
        for batch in data: ...
        rec.close()
    """
    rec = ConfigRecorder(out, batch_steps=batch_steps)
    rec.add_seed(seed)
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    for opt in (o for o in optimizers if o is not None):
        rec.add_optimizer(opt)
        rec._handles.append(opt.register_step_post_hook(lambda *a: rec.step_ended(rec.step)))
    if not _fake_run():
        rec.add_model(model)
    rec.write()
    return rec


def watch_config(out: str) -> ConfigRecorder | None:
    """Record the setup of a script that is about to run in this process (None in a fake run).

    The first module to run forward is the model: its random state, structure and checksums are
    recorded then, with that call's inputs as the first batch; each optimizer is recorded at its
    first step, and every optimizer step ends a step. Call ``close()`` after the script.
    """
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    if _fake_run():
        return None
    rec = ConfigRecorder(out)
    # the global hooks never remove themselves while torch iterates them (with another global
    # hook, the dump's, that raised "OrderedDict mutated during iteration" in the user's forward);
    # they go with the recorder's other handles once the first batches are recorded
    state: dict[str, Any] = {"root": None, "inputs": False}

    # (both return at once while torch.compile traces a module: a global hook is traced into
    # every compiled module's graph, and reading the root module there broke Dynamo's tracking)
    def first_forward(module: Any, args: tuple) -> None:
        if not torch.compiler.is_compiling() and state["root"] is None:
            state["root"] = module
            try:
                rec.add_model(module)
            except Exception as e:  # noqa: BLE001
                rec._fail("the model", e)

    def first_inputs(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if module is state["root"] and not state["inputs"]:
            state["inputs"] = True
            rec._on_forward(module, args, kwargs)

    def optimizer_step(optimizer: Any, args: tuple, kwargs: dict) -> None:
        try:
            rec.add_optimizer(optimizer)
        except Exception as e:  # noqa: BLE001
            rec._fail("the optimizer", e)

    state["pre"] = register_module_forward_pre_hook(first_forward)
    state["post"] = register_module_forward_hook(first_inputs, with_kwargs=True)
    rec._handles += [state["pre"], state["post"]]
    # optimizer hooks are removed only at close(): step_ended runs inside torch's iteration of
    # them, and removing one there raised "OrderedDict mutated during iteration" in opt.step()
    rec._late_handles += [register_optimizer_step_pre_hook(optimizer_step),
                          register_optimizer_step_post_hook(lambda *a: rec.step_ended(rec.step))]
    return rec


class RunConfigCallback(TrainCallback):
    """The setup record of each rank of the bundled engine: ``OUT/config/rank{R}.json``."""

    def __init__(self, batch_steps: int = BATCH_STEPS) -> None:
        self.batch_steps = batch_steps
        self.recorder: ConfigRecorder | None = None

    def on_train_start(self, ctx: TrainContext) -> None:
        if ctx.model is None or _fake_run():
            return
        rec = ConfigRecorder(ctx.out_dir, ctx.rank, ctx.world_size, run=ctx.run,
                             batch_steps=self.batch_steps)
        rec.add_seed(ctx.extra.get("seed"))
        rec.data["run"]["max_steps"] = ctx.max_steps
        rec.add_hyperparameters(engine=ctx.engine, preset=ctx.preset, model_config=ctx.config,
                                **{k: ctx.extra[k] for k in ENGINE_SETUP if k in ctx.extra})
        if ctx.optimizer is not None:
            rec.add_optimizer(ctx.optimizer)
        rec.add_model(ctx.model)
        rec.write()
        self.recorder = rec

    def on_step_start(self, ctx: TrainContext, step: int) -> None:
        if self.recorder is not None:
            self.recorder.step = step

    def on_step_end(self, ctx: TrainContext, step: int, metrics: dict[str, float]) -> None:
        if self.recorder is not None:
            self.recorder.step_ended(step)

    def on_train_end(self, ctx: TrainContext, error: BaseException | None = None) -> None:
        if self.recorder is not None:
            self.recorder.close()


def _describe(t: torch.Tensor, checksum: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    if checksum is not None:
        entry["checksum"] = checksum
    return entry


def _tensors(*roots: tuple[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor in nested tuples, lists and dicts, depth first."""
    stack = list(reversed(roots))
    while stack:
        path, value = stack.pop()
        if isinstance(value, torch.Tensor):
            yield path, value
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed([(f"{path}.{i}", v) for i, v in enumerate(value)]))
        elif isinstance(value, dict):
            stack.extend(reversed([(f"{path}.{k}", v) for k, v in value.items()]))


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON: numbers, strings, lists, dicts; a one-element tensor as its value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, torch.Tensor):
        return _plain(value.item()) if value.numel() == 1 else f"<tensor {list(value.shape)}>"
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if depth > 4:
        return f"<{type(value).__name__}>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    return f"<{type(value).__name__}>"


def _distributed() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def _fake_run() -> bool:
    """Whether a fake-tensor mode is active (the simulator's): there is nothing real to record."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
