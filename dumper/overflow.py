"""``probe dump --task overflow``: watch every module/API output for NaN, Inf and, in float16
and bfloat16, values at the dtype's limit; record nothing while all is finite.

An overflow is a non-finite value a call *creates*: NaN in an output when no tensor input holds
NaN (a NaN written from a scalar, ``x[0] = nan``, counts: NaN has no intended use); Inf (or a
float16/bfloat16 value at the limit) in an output when no input, tensor or scalar, holds one (a
mask filled with ``-inf`` and every sum that carries it are not overflows). An in-place call's
own target is not an input here (it holds the result already).

Each output (forward outputs, and the input gradients a backward computes) gets one pass of the
statistics backend's reduction (on the CPU the native kernel that reads max, min and the
NaN/Inf counts at memory speed); nothing else is kept or written while nothing overflows, so
the added time stays under the statistics task's, which reduces inputs, outputs and parameters
and writes every step. On the first overflowing call (or the first ``--max-hits``) the call is
written as a tensor dump of its own, in msprobe's layout:

- ``OUT/step{N}/rank{R}/dump.json`` (task ``overflow_check``): the call's inputs, keyword
  arguments and outputs with their statistics, each tensor saved under ``dump_tensor_data``;
- ``stack.json``: where the call was made; ``construct.json``: the module path that led to it
  (the call, the module it ran in, that module's parent, ... up to the model);

then watching stops. ``OUT/overflow_rank{R}.json`` says what was watched and what was found,
also when nothing was (then it is the only file the task writes).

>>> from probe.dumper.config import DumpConfig
>>> DumpConfig(task="overflow", max_hits=2).max_hits
2
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import weakref
from pathlib import Path
from typing import Any, Iterable

import torch

from probe.collectors import msprobe_writer
from probe.engine_adapter.base import FLOAT
from probe.dumper.recorder import DumpRecorder, call_stack
from probe.dumper.rows import POS, RowBuilder, apply_statistics

log = logging.getLogger(__name__)

#: dtypes whose largest finite value counts as an overflow (it is where a cast saturates)
_LIMITS = {torch.float16: torch.finfo(torch.float16).max, torch.bfloat16: torch.finfo(torch.bfloat16).max}
_WATCHED = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_STRIDED = torch.strided


class OverflowRecorder(DumpRecorder):
    """The :class:`~probe.engine_adapter.base.HookSink` of the ``overflow`` task (module docstring)."""

    def __init__(self, adapter: Any, config: Any, *, rank: int | None = None, store: Any = None) -> None:
        super().__init__(adapter, config, rank=rank, store=store)
        self.hits: list[dict] = []
        self.watched = 0
        self.carried = 0        # non-finite outputs whose NaN/Inf came in with an input
        self.steps_watched: list[int] = []
        self._reduce = adapter.stats.reduce
        self._gather = adapter.stats.gather
        self._identity = adapter.stats.identity

    def _reset(self) -> None:
        super()._reset()
        self.pending: dict[str, tuple] = {}
        self.hit_tree: dict[str, str | None] = {}    # construct.json of the step's hits
        #: data read and found finite this step (a module's output is its last call's output):
        #: identity -> the tensor first read, weakly (the key holds while it lives)
        self.finite: dict[Any, Any] = {}

    # ----------------------------------------------------------------- steps
    def begin_step(self, step: int) -> None:
        super().begin_step(step)
        if len(self.hits) >= self.config.max_hits:
            self.active = False
        if self.active:
            self.steps_watched.append(self.step)

    def end_step(self) -> None:
        self.active = False
        self._reset()

    @property
    def steps_written(self) -> list[int]:
        return sorted({h["step"] for h in self.hits})

    def drain(self) -> None:
        """Write ``OUT/overflow_rank{R}.json``."""
        try:
            root = Path(self.config.out)
            root.mkdir(parents=True, exist_ok=True)
            doc = {"rank": self.rank, "steps_watched": self.steps_watched, "outputs_watched": self.watched,
                   "carried_in": self.carried,
                   "max_hits": self.config.max_hits, "hits": self.hits,
                   "first": self.hits[0] if self.hits else None}
            tmp = root / f".overflow_rank{self.rank}.json.tmp"
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, root / f"overflow_rank{self.rank}.json")
        except Exception as e:  # noqa: BLE001 - never kill training
            self.report_error("writing the overflow summary", e)

    # ----------------------------------------------------------------- the check
    def _overflow(self, x: Any, args: Any = (), kwargs: Any = None, name: str = "") -> str | None:
        """What overflowed in the output ``x`` (a tensor or a container of them), in words, or
        None; ``args``/``kwargs``: the inputs of the call ``name`` (what they carry in is no
        overflow)."""
        found = self._nonfinite(x, count=True)
        if found is None:
            return None
        nan, inf, words = found
        inplace = _inplace(name)
        carried = self._nonfinite([args[1:] if inplace else args, list((kwargs or {}).values())],
                                  count=False, scalars=True)
        if carried is not None and ((nan and carried[0]) or (not nan and inf and carried[1])):
            self.carried += 1
            return None
        return words

    def _nonfinite(self, x: Any, *, count: bool, scalars: bool = False) -> tuple[bool, bool, str] | None:
        """``(has NaN, has Inf or a value at the limit, words)`` of the first tensor in ``x``
        holding any; Python floats count too with ``scalars`` (not as NaN, see the module
        docstring)."""
        if isinstance(x, torch.Tensor):
            dtype = x.dtype
            if dtype not in _WATCHED or x.layout is not _STRIDED or not x.numel():
                return None
            key = None
            if count:
                key = self._identity(x)
                if key is not None:
                    first = self.finite.get(key)
                    if first is not None and first() is not None:
                        return None
                self.watched += 1
            h = self._reduce(x, FLOAT)
            v = h if type(h) is list else self._gather([h])[0]
            mx, mn, nan, inf = v[0], v[1], v[4], v[5]
            if nan or inf or mx != mx:
                return (bool(nan) or mx != mx, bool(inf),
                        f"{int(nan)} NaN and {int(inf)} Inf of {x.numel()} elements ({str(dtype)[6:]})")
            limit = _LIMITS.get(dtype)
            if limit is not None and (mx >= limit or mn <= -limit):
                return False, True, f"values at the {str(dtype)[6:]} limit (max {mx:g}, min {mn:g})"
            if key is not None:
                self.finite[key] = weakref.ref(x)
            return None
        if scalars and type(x) is float and x in (math.inf, -math.inf):
            return False, True, "an Inf argument"
        if type(x) in (tuple, list):
            for i, v in enumerate(x):
                found = self._nonfinite(v, count=count, scalars=scalars)
                if found is not None:
                    return found if len(x) == 1 or not count else (*found[:2], f"output {i}: {found[2]}")
        return None

    # ----------------------------------------------------------------- modules
    def _module_started(self, name: str, args: tuple, kwargs: dict) -> None:
        self.pending[name] = (args, kwargs)

    def module_forward(self, name: str, module_key: int, output: Any, params: Iterable[tuple[str, Any]]) -> None:
        if name is None or not self.active:
            return
        try:
            self.tree.module_return(name)
            args, kwargs = self.pending.pop(name, ((), {}))
            found = self._overflow(output, args, kwargs)
            if found is not None:
                self._hit(name, "module", "forward", args, kwargs, output, found)
        except Exception as e:  # noqa: BLE001
            self.report_error("a module forward hook", e)

    def module_backward(self, name: str, module_key: int, grad_outputs: Any, grad_inputs: Any) -> None:
        if not self.active:
            return
        try:
            found = self._overflow(list(grad_inputs), list(grad_outputs))
            if found is not None:
                backward = self.tree.module_backward(name, module_key)
                self._hit(backward, "module", "backward", tuple(grad_outputs), {}, list(grad_inputs), found,
                          forward=name)
        except Exception as e:  # noqa: BLE001
            self.report_error("a module backward hook", e)

    def parameter_grad(self, base: str, module_key: int, param_name: str, grad: Any, expected: int) -> None:
        return None

    # ----------------------------------------------------------------- APIs
    def _api_started(self, name: str, kind: str, api: str, args: tuple, kwargs: dict) -> None:
        self.pending[name] = (args, kwargs)

    def api_return(self, token: Any, output: Any) -> None:
        if token is None or not self.active:
            return
        try:
            name, kind = token
            args, kwargs = self.pending.pop(name, ((), {}))
            found = self._overflow(output, args, kwargs, name)
            if found is not None:
                self._hit(name, kind, "forward", args, kwargs, output, found)
        except Exception as e:  # noqa: BLE001
            self.report_error("an API post-hook", e)

    def api_backward(self, token: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        if token is None or not self.active:
            return
        try:
            found = self._overflow(list(grad_inputs), list(grad_outputs))
            if found is not None:
                name, kind = self.tree.api_backward(token[0])
                self._hit(name, kind, "backward", tuple(grad_outputs), {}, list(grad_inputs), found,
                          forward=token[0])
        except Exception as e:  # noqa: BLE001
            self.report_error("an API backward hook", e)

    # ----------------------------------------------------------------- a hit
    def _hit(self, name: str, kind: str, direction: str, args: tuple, kwargs: dict, output: Any,
             what: str, forward: str | None = None) -> None:
        """Write the overflowing call as a tensor dump; stop watching after ``max_hits``.
        ``forward``: a backward call's forward call (whose module path it has)."""
        with self.adapter.suspended():
            frames = call_stack(sys._getframe(1), self._own_files)
            path = [name] + self._module_path(forward or name)[1:]
            values = RowBuilder(self.adapter.stats, want_hash=False, save=self._save_tensor)
            value, seq = values.value, self.tree.seq
            outs = output if type(output) in (tuple, list) else [output]
            if direction == "forward":
                entry = {
                    "input_args": [value(a, seq, name, kind, direction, "input", POS[i] if i < 64 else str(i))
                                   for i, a in enumerate(args)],
                    "input_kwargs": {k: value(v, seq, name, kind, direction, "kwarg", k) for k, v in kwargs.items()},
                    "output": [value(o, seq, name, kind, direction, "output", str(i)) for i, o in enumerate(outs)],
                }
            else:
                entry = {"input": [value(g, seq, name, kind, direction, "input", str(i))
                                   for i, g in enumerate(args) if g is not None],
                         "output": [value(g, seq, name, kind, direction, "output", str(i))
                                    for i, g in enumerate(outs) if g is not None]}
            gathered = self.adapter.stats.gather(values.handles) if values.handles else []
            apply_statistics(values.leaves, gathered, len(values.rows))
            self.data[name] = entry
            self.stacks[name] = frames
            for i, n in enumerate(path):
                self.hit_tree[n] = path[i + 1] if i + 1 < len(path) else None
            config = self.config
            folder = msprobe_writer.step_dir(config.out, self.step, self.rank)
            msprobe_writer.write_step(config.out, step=self.step, rank=self.rank, data=self.data,
                                      construct=self.hit_tree,
                                      stacks={n: _format(f) for n, f in self.stacks.items()},
                                      task="overflow_check", level=config.level,
                                      framework=self.adapter.framework,
                                      dump_data_dir=str(folder / "dump_tensor_data"))
            files = sorted({leaf.entry["data_name"] for leaf in values.leaves if "data_name" in leaf.entry})
            self.hits.append({"step": self.step, "rank": self.rank, "name": name, "kind": kind,
                              "direction": direction, "what": what, "module_path": path[1:],
                              "files": files, "folder": str(folder),
                              "stack": [f"{f[0]}:{f[1]} in {f[2]}" for f in frames[:8]]})
            if len(self.hits) >= config.max_hits:
                self.active = False
                log.warning(f"probe dump: overflow at {name} (step {self.step}, rank {self.rank}): {what}; "
                            f"its inputs and outputs are in {folder}")

    def _module_path(self, name: str) -> list[str]:
        """``name`` and the module calls it ran in, innermost first."""
        path, seen = [name], {name}
        parent = self.tree.construct.get(name)
        while parent is not None and parent not in seen:
            path.append(parent)
            seen.add(parent)
            parent = self.tree.construct.get(parent)
        return path


def _inplace(name: str) -> bool:
    """Whether the API call ``name`` (``Tensor.add_.0.forward``) writes into its first input."""
    attr = name.rsplit(".", 3)[-3] if name.count(".") >= 3 else name
    if attr.startswith("__i") and attr.endswith("__"):
        return True
    return attr == "__setitem__" or (attr.endswith("_") and not attr.endswith("__"))


def _format(frames: tuple) -> list[str]:
    """stack.json's lines of ``frames``, as msprobe writes them."""
    import linecache

    return [f"File {file}, line {line}, in {func}, \n {linecache.getline(file, line).strip()}"
            for file, line, func in frames]


def summarise_run(out: str, options: dict[str, Any], code: int) -> None:
    """The closing lines of ``probe dump --task overflow`` and ``OUT/dump_summary.json``."""
    import click

    root = Path(out)
    ranks = []
    for f in sorted(root.glob("overflow_rank*.json")):
        try:
            ranks.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    hits = sorted((h for r in ranks for h in r.get("hits", [])), key=lambda h: (h["step"], h["rank"]))
    doc = {"out": str(root), "level": options["level"], "task": "overflow", "exit_code": code,
           "ranks": [r.get("rank") for r in ranks],
           "steps_watched": sorted({s for r in ranks for s in r.get("steps_watched", [])}),
           "outputs_watched": sum(r.get("outputs_watched", 0) for r in ranks),
           "hits": hits, "first": hits[0] if hits else None}
    if root.is_dir():
        (root / "dump_summary.json").write_text(json.dumps(doc, indent=1))
    if not hits:
        click.echo(f"probe dump: overflow: no NaN/Inf in {doc['outputs_watched']} outputs over "
                   f"{len(doc['steps_watched'])} step(s); nothing written but {out}/dump_summary.json")
        return
    first = hits[0]
    click.echo(f"probe dump: overflow: first at {first['name']} (step {first['step']}, rank {first['rank']}): "
               f"{first['what']}")
    if first["module_path"]:
        click.echo(f"  module path: {' < '.join(first['module_path'])}")
    click.echo(f"  inputs and outputs: {first['folder']}/dump.json ({len(first['files'])} tensor files); "
               f"{len(hits)} hit(s) in all")
