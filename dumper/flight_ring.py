"""The flight recorder's ring: per-call statistics of a rank's last K steps, in memory set aside once.

:class:`FlightRing` is a :class:`~probe.engine_adapter.base.HookSink`: the engine adapter's module
hooks (and, at ``mix`` level, its API interception) report to it exactly as they report to the
dump's recorder, and it keeps, for every tensor it is shown, the six statistics of the adapter's
:class:`~probe.engine_adapter.base.StatsBackend` (``max, min, sum, sum of squares, NaN count, Inf
count``) in a row of three preallocated arrays, one row per step, ``K`` rows used in turn:

- ``stats``: float64 ``[K, slots, 6]``; a CPU float32/float64 tensor is read by the dump's native
  kernel (``engine_adapter/stats_kernel.c``) straight into its place in the ring (no Python
  object made for its numbers; on this thread, in pieces that keep it off torch's OpenMP
  workers: :meth:`FlightRing._read_serial`), others through :meth:`StatsBackend.reduce`;
- ``numel``: int64 ``[K, slots]``, the element count the statistics cover (a mean needs it);
- ``order``: int32 ``[K, slots]``, the position of the record in the step's execution order
  (-1: not recorded in that step).

A *slot* is one tensor of one call: a module call's forward output ``i``, its backward ``input``
(the gradient of output ``i``) and ``output`` (the gradient of input ``j``), each of its
parameters' gradients; an API call's forward output and backward gradients at ``mix`` level. Slots
are numbered the first time they are seen; the arrays grow (doubling) only while new slots
appear, during the first step. From then on a step writes into memory that is already there: 68
bytes per slot per step (:data:`SLOT_BYTES`), stated per module in ``docs/flight-recorder.md``.

What is recorded for the ring is not the dump's: no inputs, no parameters, no stacks, no tensor
ids (a module's input is the last module's output, already in the ring). :meth:`snapshot` turns
the kept steps into msprobe entries (``Module.<path>.<Class>.forward.<n>`` ...) for
:mod:`probe.dumper.flight_write` to write as an ordinary dump.

Nothing raised in here reaches the training loop: it is reported once and the step goes on.

>>> import torch
>>> from probe.engine_adapter.base import get_adapter
>>> ring = FlightRing(get_adapter("torch"), steps=2)
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
>>> ring.attach(net)
>>> for step in range(3):
...     ring.begin_step(step); net(torch.ones(2, 4)).sum().backward(); ring.end_step()
>>> ring.detach()
>>> [s for s, _ in ring.snapshot()], sorted(ring.snapshot()[-1][1])[0]
([1, 2], 'Module.0.Linear.backward.0')
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Iterable

import weakref

import numpy as np

from probe.engine_adapter.base import FLOAT, INTEGER, OPAQUE, EngineAdapter

log = logging.getLogger(__name__)

#: the statistics kept per slot: the backend's handle layout
N_STATS = 6
#: bytes of the ring per slot per step: six float64 statistics, the int64 element count, the
#: int32 execution position
SLOT_BYTES = N_STATS * 8 + 8 + 4
#: slots set aside before the first step (grown by doubling while the first step finds more)
FIRST_CAPACITY = 256
#: where each slot kind goes in an msprobe entry: (direction, entry key)
KINDS = ("forward.output", "backward.input", "backward.output", "parameter_grad")


class FlightRing:
    """The ring of one rank; see the module docstring. ``level``: ``module`` or ``mix``."""

    def __init__(self, adapter: EngineAdapter, steps: int, level: str = "module",
                 native_grads: bool = True) -> None:
        if int(steps) < 1:
            raise ValueError("a flight recorder keeps at least one step")
        if level not in ("module", "mix", "api"):
            raise ValueError(f"level {level!r}: use module or mix")
        self.adapter = adapter
        self.k = int(steps)
        self.level = level
        self.native_grads = native_grads
        self.capacity = 0
        self.active = False
        self.step = -1
        self.row = -1
        #: the step each row holds (-1: none yet)
        self.steps = np.full(self.k, -1, dtype=np.int64)
        #: per slot: (node, kind index, index text)
        self.slot_info: list[tuple[str, int, str]] = []
        #: per slot: [dtype text, shape list]
        self.slot_meta: list[list] = []
        #: node -> (kind: module|api|comm, class or API name, parent node or None)
        self.nodes: dict[str, tuple[str, str, str | None]] = {}
        self._slot_of: dict[tuple[str, int, str], int] = {}
        self._errors: set[str] = set()
        self._seq = 0
        self._module_calls: dict[int, int] = {}
        self._api_calls: dict[str, int] = {}
        self._open: list[str] = []              # module calls not returned yet
        self._backward_of: dict[str, str] = {}  # forward name -> backward name
        self._grad_name: dict[str, str] = {}    # module base -> its parameters_grad entry
        self._dev: dict[Any, Any] = {}          # device -> a torch ring of device handles
        self._where: np.ndarray | None = None   # [K, slots]: 1 where the device ring holds it
        self._kernel = self._load_kernel()
        self._prepared: Any = None              # the adapter's read-gradient type, once taken
        self._scratch = np.zeros((64, N_STATS), dtype=np.float64)   # a large tensor's pieces
        #: this step's identity key -> (its owner, weakly; the slot that read it): the same
        #: bytes shown twice (a module's output that is its parent's, a gradient handed on)
        #: are read once, as the dump does (probe.dumper.rows)
        self._seen: dict[Any, tuple] = {}
        self._grow(FIRST_CAPACITY)
        self._attached = False

    # ----------------------------------------------------------------- memory
    def _grow(self, capacity: int) -> None:
        old = self.capacity
        stats = np.zeros((self.k, capacity, N_STATS), dtype=np.float64)
        numel = np.zeros((self.k, capacity), dtype=np.int64)
        order = np.full((self.k, capacity), -1, dtype=np.int32)
        where = np.zeros((self.k, capacity), dtype=np.int8)
        if old:
            stats[:, :old] = self.stats
            numel[:, :old] = self.numel
            order[:, :old] = self.order
            where[:, :old] = self._where
        self.stats, self.numel, self.order, self._where = stats, numel, order, where
        self.capacity = capacity
        self._base = stats.ctypes.data
        for device, ring in list(self._dev.items()):
            bigger = ring.new_zeros((self.k, capacity, N_STATS))
            bigger[:, :old] = ring
            self._dev[device] = bigger

    @property
    def n_slots(self) -> int:
        return len(self.slot_info)

    @property
    def nbytes(self) -> int:
        """The ring's memory (the arrays set aside, all K rows)."""
        return int(self.stats.nbytes + self.numel.nbytes + self.order.nbytes + self._where.nbytes)

    def _slot(self, node: str, kind: int, index: str, dtype: str, shape: Any) -> int:
        key = (node, kind, index)
        slot = self._slot_of.get(key)
        if slot is None:
            slot = len(self.slot_info)
            if slot >= self.capacity:
                self._grow(self.capacity * 2)
            self._slot_of[key] = slot
            self.slot_info.append(key)
            self.slot_meta.append([dtype, list(shape)])
        return slot

    @staticmethod
    def _load_kernel() -> Any:
        try:
            from probe.engine_adapter.torch_stats import native_kernel
            from probe.ground.native import native_enabled
            kernel = native_kernel() if native_enabled() else False
            return kernel[:2] if kernel else None
        except Exception:  # noqa: BLE001 - no kernel: the backend's reduce
            return None

    # ----------------------------------------------------------------- steps
    def attach(self, model: Any = None) -> None:
        """Hook ``model`` (every model the process runs when None) and, at mix, the APIs."""
        adapter = self.adapter
        if self.level in ("module", "mix"):
            if model is not None:
                adapter.attach_modules(model, self)
            else:
                adapter.watch_models(lambda m: adapter.attach_modules(m, self, prefix=adapter.root_prefix()))
        if self.level in ("api", "mix"):
            adapter.attach_api(self)
        self._attached = True

    def detach(self) -> None:
        if self._attached:
            self._attached = False
            self.active = False
            self.adapter.detach()

    def begin_step(self, step: int) -> None:
        """Start recording ``step`` into the oldest row."""
        self.step = int(step)
        self.row = (self.row + 1) % self.k
        self.steps[self.row] = -1          # (a row half-written by an exception stays marked)
        self.order[self.row].fill(-1)
        self._where[self.row].fill(0)
        self._seq = 0
        self._module_calls.clear()
        self._api_calls.clear()
        self._seen.clear()
        self._open.clear()
        self.active = True
        self.adapter.recording(True)

    def end_step(self) -> None:
        """Close the step: the adapter's queued gradients are taken, the row is kept."""
        if not self.active:
            return
        try:
            self.adapter.finish_pending()
        except Exception as e:  # noqa: BLE001
            self.report_error("finishing the step's gradients", e)
        self.steps[self.row] = self.step
        self.active = False
        self.adapter.recording(False)

    def close_partial(self) -> None:
        """The step in flight ended in an exception: keep what it recorded as its row."""
        if self.active:
            self.steps[self.row] = self.step
            self.active = False
            try:
                self.adapter.recording(False)
            except Exception:  # noqa: BLE001
                pass

    # ----------------------------------------------------------------- recording
    def _record(self, node: str, kind: int, index: str, t: Any) -> None:
        """The statistics of tensor (or read gradient) ``t`` into this step's row."""
        if type(t) is self._prepared:      # a gradient the adapter's C++ capture read already
            dtype, shape, numel, _, values = t[:5]
            slot = self._slot(node, kind, index, str(dtype), shape)
            if values is None:
                return
            row = self.row
            self.stats[row, slot] = values
            self.numel[row, slot] = numel
            self.order[row, slot] = self._seq
            self._seq += 1
            return
        stats = self.adapter.stats
        if not isinstance(t, stats.tensor_type):
            return
        _, dtype, shape, numel, _, stat_kind = stats.describe(t)
        if stat_kind != FLOAT:
            return
        data, _ = stats.readable(t)
        if data is None:
            return
        if data is not t:
            _, _, _, numel, _, stat_kind = stats.describe(data)
        slot = self._slot(node, kind, index, dtype, shape)
        row = self.row
        kernel = self._kernel
        code = _KERNEL_DTYPES.get(dtype) if kernel is not None else None
        if code is not None and data.is_cpu and data.is_contiguous():
            key = stats.identity(data)
            seen = self._seen.get(key) if key is not None else None
            if seen is not None and _owner_holds(seen[0](), key):
                self.stats[row, slot] = self.stats[row, seen[1]]     # the same bytes, read already
            else:
                self._read_serial(kernel[code], data.data_ptr(), numel, 4 if code == 0 else 8, row, slot)
                if key is not None:
                    self._seen[key] = (weakref.ref(stats.owner(data)), slot)
        else:
            h = stats.reduce(data, stat_kind)
            if h is None:
                return
            if type(h) is list:
                self.stats[row, slot] = h
            else:                          # a device handle: kept on its device, no sync
                ring = self._dev.get(h.device)
                if ring is None:
                    ring = self._dev[h.device] = h.new_zeros((self.k, self.capacity, N_STATS))
                ring[row, slot].copy_(h, non_blocking=True)
                self._where[row, slot] = 1
        self.numel[row, slot] = numel
        self.order[row, slot] = self._seq
        self._seq += 1

    def _read_serial(self, fn: Any, ptr: int, numel: int, size: int, row: int, slot: int) -> None:
        """The kernel's statistics of ``numel`` elements at ``ptr`` into the ring, on this thread
        only: in pieces under the kernel's threshold for using torch's OpenMP threads
        (:data:`SERIAL_CHUNK`), merged here. Waking the OpenMP workers for each tensor cost up
        to a scheduler tick (~8 ms) per tensor where the cores are busy (75 forward outputs a
        step on the small preset: 0.3 s); the recorder takes no core from the training."""
        cell = self._base + (row * self.capacity + slot) * (N_STATS * 8)
        if numel <= SERIAL_CHUNK:
            fn(ptr, numel, cell)
            return
        pieces = -(-numel // SERIAL_CHUNK)
        if pieces > len(self._scratch):
            self._scratch = np.zeros((pieces, N_STATS), dtype=np.float64)
        scratch = self._scratch
        base = scratch.ctypes.data
        step = SERIAL_CHUNK * size
        for i in range(pieces - 1):
            fn(ptr + i * step, SERIAL_CHUNK, base + i * (N_STATS * 8))
        last = pieces - 1
        fn(ptr + last * step, numel - last * SERIAL_CHUNK, base + last * (N_STATS * 8))
        part = scratch[:pieces]
        out = self.stats[row, slot]
        out[0] = part[:, 0].max()
        out[1] = part[:, 1].min()
        out[2:] = part[:, 2:].sum(axis=0)

    def _record_all(self, node: str, kind: int, values: Iterable[Any]) -> None:
        for i, v in enumerate(values):
            if v is not None:
                self._record(node, kind, _POS[i] if i < 64 else str(i), v)

    # ----------------------------------------------------------------- HookSink: modules
    def module_forward_pre(self, base: str, module_key: int, args: tuple, kwargs: dict) -> str | None:
        if not self.active:
            return None
        n = self._module_calls.get(module_key, 0)
        self._module_calls[module_key] = n + 1
        name = f"{base}.forward.{n}"
        if name not in self.nodes:
            self.nodes[name] = ("module", base.rsplit(".", 1)[-1], self._open[-1] if self._open else None)
        self._open.append(name)
        return name

    def module_forward(self, name: str, module_key: int, output: Any, params: Iterable[tuple[str, Any]]) -> None:
        if name is None or not self.active:
            return
        opened = self._open
        if opened and opened[-1] == name:
            opened.pop()
        elif name in opened:
            opened.remove(name)
        try:
            outs = output if type(output) in (tuple, list) else (output,)
            self._record_all(name, 0, outs)
        except Exception as e:  # noqa: BLE001 - never break the user's forward
            self.report_error("a module forward hook", e)

    def module_backward(self, name: str, module_key: int, grad_outputs: Any, grad_inputs: Any) -> None:
        if not self.active:
            return
        try:
            backward = self._backward_of.get(name)
            if backward is None:
                base, _, n = name.rsplit(".", 2)
                backward = self._backward_of[name] = f"{base}.backward.{n}"
                kind, cls, _ = self.nodes.get(name, ("module", base.rsplit(".", 1)[-1], None))
                self.nodes.setdefault(backward, (kind, cls, None))
            self._record_all(backward, 1, grad_outputs)
            self._record_all(backward, 2, grad_inputs)
        except Exception as e:  # noqa: BLE001
            self.report_error("a module backward hook", e)

    def parameter_grad(self, base: str, module_key: int, param_name: str, grad: Any, expected: int) -> None:
        if not self.active:
            return
        try:
            name = self._grad_name.get(base)
            if name is None:
                name = self._grad_name[base] = f"{base}.parameters_grad.0"
                self.nodes.setdefault(name, ("module", base.rsplit(".", 1)[-1], None))
            self._record(name, 3, param_name, grad)
        except Exception as e:  # noqa: BLE001
            self.report_error("a parameter gradient hook", e)

    # ----------------------------------------------------------------- HookSink: APIs
    def api_call(self, api: str, args: tuple, kwargs: dict) -> Any:
        if not self.active:
            return None
        n = self._api_calls.get(api, 0)
        self._api_calls[api] = n + 1
        name = f"{api}.{n}.forward"
        if name not in self.nodes:
            kind = "comm" if api.startswith("Distributed.") else "api"
            self.nodes[name] = (kind, api, self._open[-1] if self._open else None)
        return name

    def api_return(self, token: Any, output: Any) -> None:
        if token is None or not self.active:
            return
        try:
            outs = output if type(output) in (tuple, list) else (output,)
            self._record_all(token, 0, outs)
        except Exception as e:  # noqa: BLE001
            self.report_error("an API post-hook", e)

    def api_backward(self, token: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        if token is None or not self.active:
            return
        try:
            backward = self._backward_of.get(token)
            if backward is None:
                backward = self._backward_of[token] = token[: -len("forward")] + "backward"
                kind, api, _ = self.nodes.get(token, ("api", token, None))
                self.nodes.setdefault(backward, (kind, api, None))
            self._record_all(backward, 1, grad_outputs)
            self._record_all(backward, 2, grad_inputs)
        except Exception as e:  # noqa: BLE001
            self.report_error("an API backward hook", e)

    # ----------------------------------------------------------------- HookSink: the rest
    def accept_prepared_grads(self, kind: type, replayed: bool = False) -> bool:
        """Gradients the adapter's C++ capture read already are taken (their six numbers copied
        into the ring): at module level replayed as the step ends, at mix level as they come
        (as the dump takes them). ``native_grads=False``: none, every gradient comes as a
        tensor through the Python hooks and is read here (``bench_flight.py``'s ``module``
        side; its ``module+cpp`` side is the default)."""
        if not self.native_grads or (replayed and self.level != "module"):
            return False
        self._prepared = kind
        return True

    def backward_started(self) -> None:
        """(The C++ capture's first gradient of a step: nothing to do here.)"""

    def report_error(self, where: str, error: BaseException) -> None:
        msg = str(error).splitlines()[0] if str(error) else ""
        key = f"{where}:{type(error).__name__}:{msg}"
        if key in self._errors:
            return
        self._errors.add(key)
        log.warning(f"probe flight recorder: error in {where}: {type(error).__name__}: {msg} "
                    "(the recorder goes on without it; training is not affected)",
                    exc_info=error if os.environ.get("PROBE_DEBUG") else None)

    # ----------------------------------------------------------------- reading
    def grad_norm(self, row: int | None = None) -> float:
        """The L2 norm of every parameter gradient the row recorded (NaN when none)."""
        row = self.row if row is None else row
        cap = self.n_slots
        if cap == 0:
            return math.nan
        mask = (self.order[row, :cap] >= 0) & (self._kinds()[:cap] == 3)
        if not mask.any():
            return math.nan
        return float(math.sqrt(self.stats[row, :cap, 3][mask].sum()))

    def nonfinite(self, row: int | None = None) -> int:
        """How many non-finite values the row recorded (NaN and Inf counts summed)."""
        row = self.row if row is None else row
        cap = self.n_slots
        mask = self.order[row, :cap] >= 0
        return int(self.stats[row, :cap, 4:6][mask].sum())

    def _kinds(self) -> np.ndarray:
        kinds = getattr(self, "_kind_array", None)
        if kinds is None or len(kinds) != self.n_slots:
            kinds = self._kind_array = np.fromiter((k for _, k, _ in self.slot_info), np.int8, self.n_slots)
        return kinds

    def rows_in_order(self) -> list[int]:
        """The rows holding a step, oldest step first."""
        return [int(r) for r in np.argsort(self.steps, kind="stable") if self.steps[r] >= 0]

    def row_values(self, row: int) -> np.ndarray:
        """The row's statistics (``[slots, 6]``), device-held ones brought to the host."""
        n = self.n_slots
        values = self.stats[row, :n].copy()
        if self._dev and self._where[row, :n].any():
            for ring in self._dev.values():
                dev = ring[row, :n].double().cpu().numpy()
                held = self._where[row, :n] == 1
                values[held] = dev[held]
        return values

    def snapshot(self) -> list[tuple[int, dict[str, dict]]]:
        """``[(step, {node: msprobe entry})]`` of the kept steps, oldest first; each step's entries
        in the order the step recorded them (forward calls as they returned, backward as it ran)."""
        from probe.collectors.msprobe_writer import json_float

        out = []
        kinds = KINDS
        for row in self.rows_in_order():
            n = self.n_slots
            order = self.order[row, :n]
            values = self.row_values(row)
            numel = self.numel[row, :n]
            data: dict[str, dict] = {}
            for slot in np.argsort(np.where(order >= 0, order, np.iinfo(np.int32).max), kind="stable"):
                slot = int(slot)
                if order[slot] < 0:
                    break
                node, kind, index = self.slot_info[slot]
                dtype, shape = self.slot_meta[slot]
                mx, mn, s, q, nan, inf = values[slot].tolist()
                count = int(numel[slot]) or 1
                value = {"type": "torch.Tensor", "dtype": dtype, "shape": shape,
                         "Max": json_float(mx), "Min": json_float(mn), "Mean": json_float(s / count),
                         "Norm": json_float(math.sqrt(q) if q >= 0 else q)}
                if nan or inf:
                    value["nan_count"], value["inf_count"] = int(nan), int(inf)
                entry = data.get(node)
                where = kinds[kind]
                if entry is None:
                    entry = data[node] = ({"input_args": [], "input_kwargs": {}, "output": [], "parameters": {}}
                                          if where == "forward.output" else
                                          {"input": [], "output": []} if where.startswith("backward") else {})
                if where == "parameter_grad":
                    entry[index] = [value]
                else:
                    key = "output" if where.endswith("output") else "input"
                    items = entry.setdefault(key, [])
                    i = int(index) if index.isdigit() else len(items)
                    while len(items) <= i:
                        items.append(None)
                    items[i] = value
            out.append((int(self.steps[row]), data))
        return out

    def construct(self, names: Iterable[str]) -> dict[str, str | None]:
        """construct.json of ``names``: a forward call's parent is the module call it ran in; a
        backward node's, the backward of that call when recorded."""
        names = list(names)
        present = set(names)
        out: dict[str, str | None] = {}
        for name in names:
            info = self.nodes.get(name)
            if ".backward." in name or name.endswith(".backward") or ".parameters_grad." in name:
                forward = name.replace(".backward", ".forward") if ".backward" in name else None
                parent = None
                fwd = self.nodes.get(forward) if forward else None
                p = fwd[2] if fwd else None
                while p is not None:
                    base, _, n = p.rsplit(".", 2)
                    if f"{base}.backward.{n}" in present:
                        parent = f"{base}.backward.{n}"
                        break
                    p = self.nodes.get(p, (None, None, None))[2]
                out[name] = parent
            else:
                out[name] = info[2] if info else None
        return out


def _owner_holds(owner: Any, key: tuple) -> bool:
    """Whether ``owner`` (a storage, or None when gone) still holds the address ``key`` starts
    with (as ``probe.dumper.rows`` asks before it reuses statistics)."""
    if owner is None:
        return False
    nbytes = getattr(owner, "nbytes", None)
    if not callable(nbytes) or not isinstance(key[0], int):
        return True
    base = owner.data_ptr()
    return base != 0 and base <= key[0] <= base + nbytes()


_POS = tuple(str(i) for i in range(64))
#: elements the kernel reads in one call on the calling thread (under its PARALLEL_MIN, 32768, at
#: and above which it splits the work over torch's OpenMP threads; a multiple of 16)
SERIAL_CHUNK = 32752
#: dtype text -> which of the native kernel's two entry points reads it
_KERNEL_DTYPES = {"torch.float32": 0, "torch.float64": 1}
# (INTEGER and OPAQUE tensors are not kept: the ring is for floating numerics)
_ = (INTEGER, OPAQUE)
