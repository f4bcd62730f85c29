"""The dump's recorder: what every engine adapter's hooks report to, written once.

It turns hook calls into msprobe entries (``Module.<path>.<Class>.forward.<n>``,
``Functional.linear.<n>.forward``, ``...backward``, ``...parameters_grad.<n>``), starts each
tensor's statistics on its device through the adapter's
:class:`~engine_adapter.base.StatsBackend` (no host-device synchronisation per tensor), and at
the end of a step gathers every statistic at once and writes both outputs: msprobe's
``OUT/step{N}/rank{R}/dump.json, construct.json, stack.json`` and the TENSOR and NODE records
of the Arrow store.

Nothing raised inside the recorder reaches the training loop: it is reported once on stderr
and the step goes on.

>>> from engine_adapter.base import get_adapter          # doctest: +SKIP
>>> rec = Recorder(get_adapter("torch"), out="runs/d")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import linecache
import math
import os
import queue
import re
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

from collectors import msprobe_writer
from engine_adapter.base import FLOAT, INTEGER, OPAQUE, EngineAdapter

LEVELS = ("module", "api", "mix")
TASKS = ("statistics", "tensor", "md5")

#: files of the dump machinery, left out of stack.json
_OWN_FILES = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p)
                   for p in ("probe" + os.sep, "engine_adapter" + os.sep + "torch_",
                             "engine_adapter" + os.sep + "mindspore_", "engine_adapter" + os.sep + "base"))


@dataclass
class DumpConfig:
    """What to dump: level, task and filters (``None`` selects everything)."""

    out: str = "dump"
    level: str = "module"
    task: str = "statistics"
    steps: Sequence[int] | None = None
    ranks: Sequence[int] | None = None
    scope: str | None = None          # regex searched in each entry's name
    names: Sequence[str] | None = None  # module paths, class names or API names to keep
    stack: bool = True
    run: str | None = None
    #: the store's records are made durable at the end of a step at most this often (seconds;
    #: 0 = every step). The msprobe files are always written every step; a crash loses at most
    #: this long of store records. Fast steps otherwise pay a Parquet segment per step.
    store_flush_s: float = 1.0

    def __post_init__(self) -> None:
        from ground.errors import ProbeError
        if self.level not in LEVELS:
            raise ProbeError(f"--level {self.level!r}: use one of {', '.join(LEVELS)}")
        if self.task not in TASKS:
            raise ProbeError(f"--task {self.task!r}: use one of {', '.join(TASKS)}")
        if self.scope:
            try:
                re.compile(self.scope)
            except re.error as e:
                raise ProbeError(f"--scope {self.scope!r}: not a regular expression ({e})") from None


#: index texts of the first positions (no str(i) per argument)
_POS = tuple(str(i) for i in range(64))
#: exact scalar types and their msprobe ``type`` (subclasses take the isinstance path)
_SCALAR_TYPES = {int: "int", float: "float", bool: "bool", str: "str"}


class _Leaf(NamedTuple):
    entry: dict          # the JSON dict of this tensor
    handle_index: int    # index into the step's handles, -1 when none
    row: int             # index into the step's rows
    numel: int
    kind: str


class _ApiCall:
    """The token of one recorded API call (handed back by the adapter on return/backward)."""

    __slots__ = ("name", "kind")

    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind


class Recorder:
    """Implements :class:`~engine_adapter.base.HookSink` for the dump; one per process."""

    def __init__(self, adapter: EngineAdapter, config: DumpConfig, *, rank: int | None = None,
                 store: Any = None) -> None:
        self.adapter = adapter
        self.stats = adapter.stats
        self._tensor_type = adapter.stats.tensor_type
        self.config = config
        self.rank = adapter.rank() if rank is None else int(rank)
        self.store = store
        self.run = config.run or os.path.basename(os.path.abspath(config.out))
        self._steps = set(config.steps) if config.steps is not None else None
        self._scope = re.compile(config.scope) if config.scope else None
        self._names = tuple(f".{n.strip('.')}." for n in config.names) if config.names else None
        self._rank_selected = config.ranks is None or self.rank in set(config.ranks)
        self._want_stats = True
        self._want_hash = config.task == "md5"
        self._want_files = config.task == "tensor"
        self._errors_reported: set[str] = set()
        self._include_cache: dict[str, bool] = {}
        self._stack_cache: dict[str, tuple] = {}
        self._formatted_stacks: dict[tuple, list[str]] = {}
        self._writer: _Writer | None = None
        self._nodes_written: set[str] = set()
        self._last_store_flush = float("-inf")
        self._store_tables: list[Any] = []    # tensor records of steps not yet in the store
        self._tables: _TensorTables | None = None
        self.step = -1
        self.active = False
        self.steps_written: list[int] = []
        self.entries_written = 0
        self._reset()

    # ----------------------------------------------------------------- steps
    def begin_step(self, step: int) -> None:
        """Start recording ``step`` (when it is selected)."""
        self.step = int(step)
        self._reset()
        self.active = self._rank_selected and (self._steps is None or self.step in self._steps)

    def end_step(self) -> None:
        """Finish the current step: gather statistics and write its files."""
        if self.active:
            try:
                with self.adapter.suspended():
                    self._flush()
            except Exception as e:  # noqa: BLE001 - never kill training
                self.report_error("writing the dump", e)
        self.active = False
        self._reset()

    def wants_step(self, step: int) -> bool:
        return self._steps is None or step in self._steps

    @property
    def last_step(self) -> int | None:
        return max(self._steps) if self._steps else None

    def _reset(self) -> None:
        self.data: dict[str, dict] = {}
        self.open_entries: dict[str, dict] = {}
        self.construct: dict[str, str | None] = {}
        self.node_info: dict[str, tuple[str, str, int]] = {}   # name -> (kind, class, order)
        self.stacks: dict[str, tuple] = {}
        self.leaves: list[_Leaf] = []
        self.handles: list[Any] = []
        self.rows: list[list] = []
        self.fwd_stack: list[str] = []
        self.bwd_stack: list[str] = []
        self.module_calls: dict[int, int] = {}
        self.module_open: dict[int, list[int]] = {}
        self.module_bwd_seen: dict[int, int] = {}
        self.param_grads: dict[int, dict] = {}
        self.api_counts: dict[str, int] = {}
        self.seq = 0
        self._seen: dict[Any, tuple] = {}


    # ----------------------------------------------------------------- filters
    def include(self, base: str) -> bool:
        """Whether entries of ``base`` (``Module.layers.0.attn.Attention``, ``Functional.linear``) are kept."""
        hit = self._include_cache.get(base)
        if hit is None:
            hit = True
            if self._scope is not None and not self._scope.search(base):
                hit = False
            if hit and self._names is not None:
                dotted = f".{base}."
                hit = any(n in dotted for n in self._names)
            self._include_cache[base] = hit
        return hit

    # ----------------------------------------------------------------- values
    def _value(self, x: Any, node: str, kind: str, direction: str, slot: str, index: str) -> Any:
        if isinstance(x, self._tensor_type):
            return self._tensor(x, node, kind, direction, slot, index)
        if x is None:
            return None
        tx = type(x)
        if tx in _SCALAR_TYPES:
            return self._scalar(_SCALAR_TYPES[tx], x, node, kind, direction, slot, index)
        if isinstance(x, bool):
            return self._scalar("bool", x, node, kind, direction, slot, index)
        if isinstance(x, int):
            return self._scalar("int", x, node, kind, direction, slot, index)
        if isinstance(x, float):
            return self._scalar("float", x, node, kind, direction, slot, index)
        if isinstance(x, str):
            return self._scalar("str", x, node, kind, direction, slot, index)
        if (tx is list or tx is tuple):
            return [self._value(v, node, kind, direction, slot, f"{index}.{i}") for i, v in enumerate(x)]
        type_name = self.stats.scalar_type(x)
        if type_name is not None:
            v = list(x) if type_name.endswith("Size") else str(x)
            return self._scalar(type_name, v, node, kind, direction, slot, index)
        if isinstance(x, slice):
            return self._scalar("slice", [_plain(x.start), _plain(x.stop), _plain(x.step)],
                                node, kind, direction, slot, index)
        if x is Ellipsis:
            return self._scalar("ellipsis", "...", node, kind, direction, slot, index)
        if isinstance(x, dict):
            return {str(k): self._value(v, node, kind, direction, slot, f"{index}.{k}") for k, v in x.items()}
        if isinstance(x, (list, tuple)):  # namedtuples and list subclasses
            return [self._value(v, node, kind, direction, slot, f"{index}.{i}") for i, v in enumerate(x)]
        return None

    def _scalar(self, type_name: str, v: Any, node: str, kind: str, direction: str, slot: str,
                index: str) -> dict:
        tv = type(v)
        if tv is int:
            text = int.__repr__(v)
        elif tv is bool:
            text = "true" if v else "false"
        elif tv is float and math.isfinite(v):
            text = float.__repr__(v)
        else:
            finite = not isinstance(v, float) or math.isfinite(v)
            text = json.dumps(v if finite else str(v))
            if not finite:
                v = msprobe_writer.json_float(v)
            elif tv is list:          # a slice's bounds may be floats
                v = [msprobe_writer.json_float(x) if type(x) is float else x for x in v]
        self.rows.append([self.seq, node, kind, direction, slot, index, type_name, None, None,
                          None, None, None, None, None, None, None, None, None, text])
        return {"type": type_name, "value": v}

    def _tensor(self, t: Any, node: str, kind: str, direction: str, slot: str, index: str) -> dict:
        stats = self.stats
        meta = stats.describe(t)
        shape = list(meta.shape)
        requires_grad = meta.requires_grad
        entry: dict[str, Any] = {"type": meta.type_name, "dtype": meta.dtype, "shape": shape,
                                 "Max": None, "Min": None, "Mean": None, "Norm": None}
        if requires_grad is not None:
            entry["requires_grad"] = requires_grad
        handle_index = -1
        digest = file_name = None
        key = stats.identity(t)
        seen = self._seen.get(key) if key is not None else None
        if seen is not None and seen[0]() is not None:
            handle_index, digest = seen[1], seen[2]
        else:
            stat_kind = meta.kind
            if stat_kind != OPAQUE:
                handles = self.handles
                handle_index = len(handles)
                handles.append(stats.reduce(t, stat_kind))
            if self._want_hash:
                digest = stats.digest(t)
            if key is not None:
                self._seen[key] = (weakref.ref(t), handle_index, digest)
        if digest is not None:
            entry["md5"] = digest
        if self._want_files:
            file_name = self._save_tensor(t, f"{node}.{slot}.{index}")
            entry["data_name"] = file_name
        rows = self.rows
        self.leaves.append(_Leaf(entry, handle_index, len(rows), meta.numel, meta.kind))
        rows.append([self.seq, node, kind, direction, slot, index, meta.dtype, shape, meta.numel,
                     None, None, None, None, None, None, digest, file_name, requires_grad, None])
        return entry

    def _save_tensor(self, t: Any, name: str) -> str:
        folder = msprobe_writer.step_dir(self.config.out, self.step, self.rank) / "dump_tensor_data"
        folder.mkdir(exist_ok=True)
        path = msprobe_writer.contained_path(folder, name, ".safetensors")
        self.stats.save({"tensor": t}, str(path))
        return path.name

    # ----------------------------------------------------------------- nodes
    def _node(self, name: str, kind: str, class_name: str, parent: str | None) -> None:
        self.construct[name] = parent
        self.node_info[name] = (kind, class_name, self.seq)
        self.seq += 1

    def _capture_stack(self, name: str) -> None:
        if not self.config.stack:
            return
        cached = self._stack_cache.get(name)
        if cached is not None:       # the same call of the same module/API: captured once per run
            self.stacks[name] = cached
            return
        frames = []
        f = sys._getframe(2)
        while f is not None:
            code = f.f_code
            if not code.co_filename.startswith(_OWN_FILES):
                frames.append((code.co_filename, f.f_lineno, code.co_name))
            f = f.f_back
        self.stacks[name] = self._stack_cache[name] = tuple(frames)

    # ----------------------------------------------------------------- modules
    def module_forward_pre(self, base: str, module_key: int, args: tuple, kwargs: dict) -> str | None:
        if not self.active or not self.include(base):
            return None
        try:
            n = self.module_calls.get(module_key, 0)
            self.module_calls[module_key] = n + 1
            self.module_open.setdefault(module_key, []).append(n)
            name = f"{base}.forward.{n}"
            parent = self.fwd_stack[-1] if self.fwd_stack else None
            self._node(name, "module", base.rsplit(".", 1)[-1], parent)
            self.fwd_stack.append(name)
            self._capture_stack(name)
            self.open_entries[name] = {
                "input_args": [self._value(a, name, "module", "forward", "input", str(i)) for i, a in enumerate(args)],
                "input_kwargs": {k: self._value(v, name, "module", "forward", "kwarg", k) for k, v in kwargs.items()},
            }
            return name
        except Exception as e:  # noqa: BLE001
            self.report_error("a module forward pre-hook", e)
            return None

    def module_forward(self, name: str, module_key: int, output: Any, params: Iterable[tuple[str, Any]]) -> None:
        if name is None or not self.active:
            return
        try:
            if self.fwd_stack and self.fwd_stack[-1] == name:
                self.fwd_stack.pop()
            elif name in self.fwd_stack:
                self.fwd_stack.remove(name)
            entry = self.open_entries.pop(name, None)
            if entry is None:
                return
            self.data[name] = entry
            outs = output if isinstance(output, (tuple, list)) and type(output).__module__ == "builtins" else [output]
            entry["output"] = [self._value(o, name, "module", "forward", "output", str(i)) for i, o in enumerate(outs)]
            entry["parameters"] = {p: self._value(t, name, "module", "forward", "parameter", p) for p, t in params}
        except Exception as e:  # noqa: BLE001
            self.report_error("a module forward hook", e)

    def module_backward_pre(self, base: str, module_key: int) -> None:
        """A module's backward starts (for the parent of APIs and modules run inside it)."""
        if not self.active or not self.include(base):
            return
        open_calls = self.module_open.get(module_key)
        n = open_calls[-1] if open_calls else self.module_bwd_seen.get(module_key, 0)
        self.bwd_stack.append(f"{base}.backward.{n}")

    def module_backward(self, base: str, module_key: int, grad_outputs: Any, grad_inputs: Any) -> None:
        if not self.active or not self.include(base):
            return
        try:
            open_calls = self.module_open.get(module_key)
            n = open_calls.pop() if open_calls else self.module_bwd_seen.get(module_key, 0)
            self.module_bwd_seen[module_key] = n + 1
            name = f"{base}.backward.{n}"
            if self.bwd_stack and self.bwd_stack[-1] == name:
                self.bwd_stack.pop()
            parent = self.bwd_stack[-1] if self.bwd_stack else None
            self._node(name, "module", base.rsplit(".", 1)[-1], parent)
            self.data[name] = {
                "input": [self._value(g, name, "module", "backward", "input", str(i))
                          for i, g in enumerate(grad_outputs) if g is not None],
                "output": [self._value(g, name, "module", "backward", "output", str(i))
                           for i, g in enumerate(grad_inputs) if g is not None],
            }
            self._emit_param_grads(base, module_key, complete_only=True)
        except Exception as e:  # noqa: BLE001
            self.report_error("a module backward hook", e)

    def parameter_grad(self, base: str, module_key: int, param_name: str, grad: Any, expected: int) -> None:
        if not self.active or not self.include(base):
            return
        try:
            pending = self.param_grads.setdefault(module_key, {"base": base, "grads": {}, "expected": expected})
            pending["grads"][param_name] = grad
            if len(pending["grads"]) >= expected:
                self._emit_param_grads(base, module_key, complete_only=False)
        except Exception as e:  # noqa: BLE001
            self.report_error("a parameter gradient hook", e)

    def _emit_param_grads(self, base: str, module_key: int, *, complete_only: bool) -> None:
        pending = self.param_grads.get(module_key)
        if not pending or (complete_only and len(pending["grads"]) < pending["expected"]):
            return
        del self.param_grads[module_key]
        n = 0
        while f"{base}.parameters_grad.{n}" in self.data:
            n += 1
        name = f"{base}.parameters_grad.{n}"
        self.node_info[name] = ("module", base.rsplit(".", 1)[-1], self.seq)
        self.seq += 1
        self.data[name] = {p: [self._value(g, name, "module", "backward", "parameter_grad", p)]
                           for p, g in pending["grads"].items()}

    # ----------------------------------------------------------------- APIs
    def api_call(self, api: str, args: tuple, kwargs: dict) -> Any:
        if not self.active or not self.include(api):
            return None
        try:
            n = self.api_counts.get(api, 0)
            self.api_counts[api] = n + 1
            name = f"{api}.{n}.forward"
            kind = "comm" if api.startswith("Distributed.") else "api"
            parent = self.fwd_stack[-1] if self.fwd_stack else None
            self._node(name, kind, api, parent)
            self._capture_stack(name)
            value = self._value
            self.open_entries[name] = {
                "input_args": [value(a, name, kind, "forward", "input", _POS[i] if i < 64 else str(i))
                               for i, a in enumerate(args)],
                "input_kwargs": {k: value(v, name, kind, "forward", "kwarg", k) for k, v in kwargs.items()},
            }
            return _ApiCall(name, kind)
        except Exception as e:  # noqa: BLE001
            self.report_error("an API pre-hook", e)
            return None

    def api_return(self, token: Any, output: Any) -> None:
        if token is None or not self.active:
            return
        try:
            name = token.name
            entry = self.open_entries.pop(name, None)
            if entry is None:
                return
            self.data[name] = entry
            kind = token.kind
            to = type(output)
            outs = output if to is tuple or to is list else (output,)
            value = self._value
            entry["output"] = [value(o, name, kind, "forward", "output", _POS[i] if i < 64 else str(i))
                               for i, o in enumerate(outs)]
        except Exception as e:  # noqa: BLE001
            self.report_error("an API post-hook", e)

    def api_backward(self, token: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        if token is None or not self.active:
            return
        try:
            fwd = token.name
            name = fwd[: -len("forward")] + "backward"
            kind, api, _ = self.node_info.get(fwd, ("api", fwd, 0))
            parent = self.bwd_stack[-1] if self.bwd_stack else None
            self._node(name, kind, api, parent)
            self.data[name] = {
                "input": [self._value(g, name, kind, "backward", "input", str(i))
                          for i, g in enumerate(grad_outputs) if g is not None],
                "output": [self._value(g, name, kind, "backward", "output", str(i))
                           for i, g in enumerate(grad_inputs) if g is not None],
            }
        except Exception as e:  # noqa: BLE001
            self.report_error("an API backward hook", e)

    # ----------------------------------------------------------------- errors
    def report_error(self, where: str, error: BaseException) -> None:
        msg = str(error).splitlines()[0] if str(error) else ""
        key = f"{type(error).__name__}:{msg}"
        if key in self._errors_reported:
            return
        self._errors_reported.add(key)
        print(f"probe dump: error in {where}: {type(error).__name__}: {msg} "
              "(the dump goes on without it; training is not affected)", file=sys.stderr)
        if os.environ.get("PROBE_DEBUG"):
            import traceback
            traceback.print_exception(error)

    # ----------------------------------------------------------------- writing
    def _flush(self) -> None:
        """Close the step on the hot path; the gather and all file writing go to the writer thread."""
        for key, pending in list(self.param_grads.items()):
            self._emit_param_grads(pending["base"], key, complete_only=False)
        for name, entry in self.open_entries.items():   # calls that never returned (an exception)
            entry["output"] = []
            self.data[name] = entry
        batch = _StepBatch(self.step, self.data, self.construct, self.node_info, self.stacks,
                           self.leaves, self.handles, self.rows)
        if self._writer is None:
            self._writer = _Writer(self)
        self._writer.submit(batch)

    def drain(self) -> None:
        """Wait until every finished step is on disk (store records included)."""
        if self._writer is not None:
            self._writer.drain()
        if self.store is not None and self.steps_written:
            self._flush_store(self.steps_written[-1])

    def _write_batch(self, b: "_StepBatch") -> None:
        values = self.stats.gather(b.handles) if b.handles else []
        rows = b.rows
        json_float = msprobe_writer.json_float
        for i, leaf in enumerate(b.leaves):
            if i & 63 == 63:
                time.sleep(0)       # let the training thread take the GIL back between chunks
            if leaf.handle_index < 0:
                continue
            v = values[leaf.handle_index]
            if v is None:
                continue
            e, r = leaf.entry, rows[leaf.row]
            if leaf.kind == FLOAT:
                mx, mn, s, q, nan, inf = v
                mean = s / leaf.numel
                norm = math.sqrt(q) if q >= 0 else q
                r[9:15] = [mx, mn, mean, norm, int(nan), int(inf)]
                if not math.isfinite(mx - mn + mean + norm):   # msprobe's NaN/Infinity literals
                    mx, mn, mean, norm = json_float(mx), json_float(mn), json_float(mean), json_float(norm)
                e["Max"], e["Min"], e["Mean"], e["Norm"] = mx, mn, mean, norm
            elif leaf.kind == INTEGER:
                mx, mn = int(v[0]), int(v[1])
                e["Max"], e["Min"] = mx, mn
                r[9:15] = [float(mx), float(mn), None, None, 0, 0]
        formatted = self._formatted_stacks
        stacks = {}
        for name, frames in b.stacks.items():
            text = formatted.get(frames)
            if text is None:
                text = formatted[frames] = _format_frames(frames)
            stacks[name] = text
        dump_data_dir = None
        if self._want_files:
            dump_data_dir = str(msprobe_writer.step_dir(self.config.out, b.step, self.rank) / "dump_tensor_data")
        msprobe_writer.write_step(self.config.out, step=b.step, rank=self.rank, data=b.data,
                                  construct=b.construct, stacks=stacks, task=self.config.task,
                                  level=self.config.level, framework=self.adapter.framework,
                                  dump_data_dir=dump_data_dir, finite=True)
        self.steps_written.append(b.step)
        self.entries_written += len(b.data)
        if self.store is not None:
            self._write_store(b, stacks)

    def _write_store(self, b: "_StepBatch", stacks: dict[str, list[str]]) -> None:
        from collectors.records import table_from_columns

        if self._tables is None:
            self._tables = _TensorTables(self.run, self.rank)
        self._store_tables.append(self._tables.table(b.step, time.time_ns(), b.rows))
        written = self._nodes_written
        if any(name not in written for name in b.node_info):   # the tree is the same every step
            stack_ids = {}
            for gid, (group, _) in msprobe_writer.group_stacks(stacks).items():
                for name in group:
                    stack_ids[name] = gid
            depth: dict[str, int] = {}
            node_rows: dict[str, list] = {k: [] for k in ("node", "parent", "class_name", "depth",
                                                          "order", "stack_ref")}
            for name, (kind, cls, order) in b.node_info.items():
                parent = b.construct.get(name)
                d = depth.get(parent, -1) + 1 if parent else 0
                depth[name] = d
                if name in written:
                    continue
                written.add(name)
                node_rows["node"].append(name)
                node_rows["parent"].append(parent)
                node_rows["class_name"].append(cls)
                node_rows["depth"].append(d)
                node_rows["order"].append(order)
                node_rows["stack_ref"].append(stack_ids.get(name))
            m = len(node_rows["node"])
            node_rows.update(run=[self.run] * m, rank=[self.rank] * m)
            self.store.write("node", table_from_columns("node", node_rows))
        now = time.monotonic()
        if now - self._last_store_flush >= self.config.store_flush_s:
            self._flush_store(b.step)
            self._last_store_flush = now

    def _flush_store(self, step: int) -> None:
        """The tensor records of every step written since the last flush as one durable segment."""
        import pyarrow as pa

        pending, self._store_tables = self._store_tables, []
        if pending:
            self.store.write("tensor", pa.concat_tables(pending) if len(pending) > 1 else pending[0])
        self.store.end_step(step)


class _TensorTables:
    """Turns a step's rows into a tensor-record table on the writer thread.

    A training step records the same calls every step: the columns that describe them (names,
    slots, dtypes, shapes, ...) are the same lists, and their Arrow arrays are kept from the last
    step and used again when they are; only the statistics are converted each step.
    """

    #: the describing columns: the same every step while the model makes the same calls
    STRUCTURE = ("seq", "node", "node_kind", "direction", "slot", "index", "dtype", "shape", "numel",
                 "requires_grad")

    def __init__(self, run: str, rank: int) -> None:
        import pyarrow as pa

        from collectors.records import schema_for

        self.pa, self.schema = pa, schema_for("tensor")
        self.types = {name: self.schema.field(name).type for name in _TENSOR_COLUMNS}
        self.structure = tuple(_TENSOR_COLUMNS.index(name) for name in self.STRUCTURE)
        self.run, self.rank = run, rank
        self.key: list | None = None
        self.arrays: dict[str, Any] = {}

    def table(self, step: int, time_ns: int, rows: list[list]) -> Any:
        pa, schema = self.pa, self.schema
        n = len(rows)
        columns = list(zip(*rows)) if n else [()] * len(_TENSOR_COLUMNS)
        key = [columns[i] for i in self.structure]
        if key != self.key:
            self.key = key
            self.arrays = {name: pa.array(col, type=self.types[name])
                           for name, col in zip(self.STRUCTURE, key)}
            self.arrays["run"] = pa.array([self.run] * n, type=pa.string())
            self.arrays["rank"] = pa.array([self.rank] * n, type=pa.int32())
        arrays = dict(self.arrays)
        for i, name in enumerate(_TENSOR_COLUMNS):
            if name not in arrays:
                arrays[name] = pa.array(columns[i], type=self.types[name])
        arrays["step"] = pa.array([step] * n, type=pa.int64())
        arrays["host_ts_ns"] = pa.array([time_ns] * n, type=pa.int64())
        return pa.Table.from_arrays([arrays[name] for name in schema.names], schema=schema)


#: the tensor record columns of a row in ``Recorder.rows``, in order
_TENSOR_COLUMNS = ("seq", "node", "node_kind", "direction", "slot", "index", "dtype", "shape", "numel",
                   "max", "min", "mean", "l2norm", "nan_count", "inf_count", "hash", "tensor_file",
                   "requires_grad", "value")


@dataclass
class _StepBatch:
    """Everything one finished step hands to the writer thread."""

    step: int
    data: dict
    construct: dict
    node_info: dict
    stacks: dict
    leaves: list
    handles: list
    rows: list


class _Writer:
    """One background thread that gathers statistics and writes files, a step at a time.

    The queue holds at most :data:`QUEUE_STEPS` steps (statistics and names, a few hundred KB a
    step): a disk that stalls for a moment (writeback, a shared volume) does not stall
    training, while a disk slower than training for good makes the training thread wait at the
    end of a step instead of holding unbounded memory.
    """

    QUEUE_STEPS = 16

    def __init__(self, recorder: "Recorder") -> None:
        self.recorder = recorder
        self.queue: queue.Queue = queue.Queue(maxsize=self.QUEUE_STEPS)
        self.thread = threading.Thread(target=self._run, name="probe-dump-writer", daemon=True)
        self.thread.start()

    def submit(self, batch: _StepBatch) -> None:
        self.queue.put(batch)

    def drain(self) -> None:
        self.queue.join()

    def _run(self) -> None:
        rec = self.recorder
        with rec.adapter.suspended():
            while True:
                batch = self.queue.get()
                try:
                    rec._write_batch(batch)
                except Exception as e:  # noqa: BLE001 - never kill training
                    rec.report_error(f"writing step {batch.step}", e)
                finally:
                    self.queue.task_done()


def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, (int, float, str, bool)) else str(v)


def _format_frames(frames: tuple) -> list[str]:
    out = []
    for filename, lineno, func in frames:
        line = linecache.getline(filename, lineno).strip()
        out.append(f"File {filename}, line {lineno}, in {func}, \n {line}")
    return out
